"""The earlier request, by the id its answer carried.

A worker keeps the records of the requests that asked for diagnostics in memory (the
record object itself: its usage is filled in when it finishes), bounded by their segment
count, least recent out first. An id it does not hold is looked up in the store, in a
thread: every worker and every gateway on the same store, and a restarted one, find each
other's requests there. A record reaches the store a moment after its answer ends (the
writer's batch, ``flush_interval``), so an id this gateway could have given and not yet
found is asked again for up to ``patience`` seconds before it is called not found.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable

from prefixgate.diagnostics.request import request_id_of
from prefixgate.ledger.causes import Ledger
from prefixgate.record.record import Record
from prefixgate.store.base import Store

log = logging.getLogger("prefixgate.diagnostics")

MAX_SEGMENTS = 400_000  # segments held in memory (a Segment is ~100 bytes)
MAX_LEDGERS = 10_000


class Fingerprints:
    """Requests that asked for diagnostics, by request id: memory, then the store."""

    def __init__(
        self,
        store: Callable[[], Store] | None = None,
        *,
        max_segments: int = MAX_SEGMENTS,
        patience: float = 3.0,
    ) -> None:
        self._recent: OrderedDict[str, Record] = OrderedDict()
        self._segments = 0
        self.max_segments = max_segments
        self._factory = store
        self._store: Store | None = None
        self.patience = patience
        self._ledgers: OrderedDict[str, Ledger] = OrderedDict()

    def ledger_then(self, rec: Record, then: Callable[[Ledger | None], None] | None):
        """The ledger worker's callback for a request that asked for diagnostics: its
        ledger kept (bounded) for ``GET /v1/diagnostics/{id}``, then ``then``'s."""

        def done(ledger: Ledger | None) -> None:
            if ledger is not None:
                self._ledgers[rec.request_id] = ledger
                while len(self._ledgers) > MAX_LEDGERS:
                    self._ledgers.popitem(last=False)
            if then is not None:
                then(ledger)

        return done

    def ledger(self, request_id: str) -> Ledger | None:
        """A request's ledger computed by this worker, or None."""
        return self._ledgers.get(request_id)

    async def stored_ledger(self, request_id: str) -> Ledger | None:
        """A request's ledger from the store (another worker's), or None."""
        if self._factory is None:
            return None
        try:
            return await asyncio.to_thread(self._read, "get_ledger", request_id)
        except LookupFailed:
            return None

    def keep(self, rec: Record) -> None:
        """Hold ``rec`` (its segments captured) for the requests that will name it."""
        if rec.request_id in self._recent:
            return
        self._recent[rec.request_id] = rec
        self._segments += _size(rec)
        while self._segments > self.max_segments and len(self._recent) > 1:
            _, old = self._recent.popitem(last=False)
            self._segments -= _size(old)

    async def find(self, answer_id: str) -> tuple[Record | None, str | None]:
        """The record an answer's id names and where it was found (``memory`` or
        ``store``); ``(None, None)`` when neither has it."""
        rid = request_id_of(answer_id)
        if rid is None:
            return None, None
        rec = self._recent.get(rid)
        if rec is not None:
            self._recent.move_to_end(rid)
            return rec, "memory"
        if self._factory is None:
            return None, None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.patience
        wait = 0.05
        while True:
            failed = False
            try:
                rec = await asyncio.to_thread(self._read, "get_record", rid)
            except LookupFailed:  # down, or not yet migrated by its writer: asked again
                rec, failed = None, True
            if rec is not None:
                return rec, "store"
            if loop.time() + wait > deadline:
                if failed:
                    raise LookupFailed(rid)
                return None, None
            await asyncio.sleep(wait)
            wait = min(wait * 2, 0.4)

    def _read(self, method: str, rid: str):
        """``store.<method>(rid)`` (in a thread); a failure closes the store, to be opened
        again next time, and raises :class:`LookupFailed`."""
        try:
            if self._store is None:
                self._store = self._factory()
            return getattr(self._store, method)(rid)
        except Exception as exc:
            log.warning("diagnostics: cannot read the store: %s", exc)
            store, self._store = self._store, None
            if store is not None:
                with contextlib.suppress(Exception):
                    store.close()
            raise LookupFailed(rid) from exc

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


class LookupFailed(Exception):
    """The store could not be read: the answer is ``unavailable``, not "not found"."""


def _size(rec: Record) -> int:
    return len(rec.segments_in or ()) + len(rec.segments_out or ()) + 1
