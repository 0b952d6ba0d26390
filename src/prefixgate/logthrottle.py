"""Repeated log lines, once per interval: a failing upstream under load would otherwise
write a line per request (thousands a second). The first occurrence of a key is logged at
once; the ones after it within the interval are counted, and the next line logged for
that key says how many were left out."""

from __future__ import annotations

import logging
import time


class LogThrottle:
    def __init__(self, logger: logging.Logger, interval: float = 10.0, max_keys: int = 4096):
        self.logger = logger
        self.interval = interval
        self.max_keys = max_keys
        self._seen: dict[object, list] = {}  # key -> [time last logged, suppressed count]

    def warning(self, key: object, msg: str, *args) -> bool:
        """Log ``msg % args`` as a warning unless ``key`` was logged within the interval;
        returns whether it was logged."""
        now = time.monotonic()
        entry = self._seen.get(key)
        if entry is not None and now - entry[0] < self.interval:
            entry[1] += 1
            return False
        suppressed = entry[1] if entry is not None else 0
        if entry is None and len(self._seen) >= self.max_keys:
            self._seen.clear()  # bounded: a flood of distinct keys only logs more often
        self._seen[key] = [now, 0]
        if suppressed:
            msg += " (and %d more like it since)"
            args = (*args, suppressed)
        self.logger.warning(msg, *args)
        return True
