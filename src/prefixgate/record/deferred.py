"""Segment capture off the request's clock: the ``capture`` step schedules it for the event
loop's next turn, when the request is on its way upstream and the gateway waits for the
first byte; the record's finish runs it first if it is still pending."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefixgate.engine.order import RenderOrders
    from prefixgate.record import Record

log = logging.getLogger("prefixgate")


class DeferredCapture:
    """The captures scheduled and not yet run, per request id. ``capture``: the store's
    capture (``record/capture.py``), or None when nothing is captured; ``orders``: the
    gateway's, the templates the segments are placed for."""

    def __init__(self, capture: Callable[..., None] | None, orders: RenderOrders) -> None:
        self.capture = capture
        self.orders = orders
        self._pending: dict[str, tuple] = {}  # request id -> the capture's arguments
        self._own: Callable[..., None] | None = None  # for diagnostics without a store

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def soon(self, rec: Record, *args) -> None:
        """Capture on the loop's next turn (about 1 ms for Claude Code's 50 KB request,
        spent while the upstream works); a retry replaces the pending one."""
        pending = rec.request_id in self._pending
        self._pending[rec.request_id] = (rec, *args)
        if not pending:
            asyncio.get_running_loop().call_soon(self.now, rec.request_id)

    def now(self, request_id: str) -> None:
        """The pending capture of ``request_id``, run now (nothing if none is pending)."""
        args = self._pending.pop(request_id, None)
        if args is None or self.capture is None:
            return
        try:
            self.capture(*args, orders=self.orders)
        except Exception:  # the capture must never break the request path
            log.exception("segment capture failed (request %s)", request_id)

    def for_diagnostics(self, rec: Record, *args) -> None:
        """Segments for a request that asked for diagnostics when no capture is
        configured (no store): hashes only, kept with the worker's fingerprints."""
        if self._own is None:
            from prefixgate.record.capture import Capturer

            self._own = Capturer(change_budget=0)
        try:
            self._own(rec, *args, orders=self.orders)
        except Exception:  # never break the request path: the answer is "unavailable"
            log.exception("segment capture failed (request %s)", rec.request_id)


__all__ = ["DeferredCapture"]
