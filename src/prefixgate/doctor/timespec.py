"""``--since`` / ``--until`` values: a date, an ISO time, a relative age, or epoch seconds."""

from __future__ import annotations

import datetime as dt
import re
import time

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_time(value: str | float | int, *, now: float | None = None) -> float:
    """UNIX seconds for ``value``:

    - ``"2026-08-13"`` → that day's midnight (UTC unless the value names a zone);
      ``"2026-08-13T09:28"`` / ``"2026-08-13 09:28:00+08:00"`` → that instant;
    - ``"24h"``, ``"7d"``, ``"30m"``, ``"90s"``, ``"2w"`` → that long before ``now``;
    - ``1786924800`` / ``"1786924800.5"`` → epoch seconds as given.
    """
    if isinstance(value, int | float):
        return float(value)
    text = value.strip()
    if not text:
        raise ValueError("empty time")
    m = _AGE.match(text)
    if m:
        ref = time.time() if now is None else now
        return ref - float(m.group(1)) * _UNIT[m.group(2).lower()]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(
            f"cannot read time {value!r}: want 2026-08-13, an ISO time, 24h/7d or epoch seconds"
        ) from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def format_time(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def format_day(day: int) -> str:
    return dt.datetime.fromtimestamp(day * 86400, dt.UTC).strftime("%Y-%m-%d")
