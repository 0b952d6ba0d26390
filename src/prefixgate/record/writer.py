"""The record writer: each record into the journal as its answer completes, then into the
store in batches, off the request path.

``submit()`` appends the record to the journal (``record/journal.py``: one ``os.write``,
which survives the process being killed) and returns. A background task takes batches
off the backlog (up to ``batch_size``, or whatever arrived within ``flush_interval``) and
writes each to the store in a worker thread; a stored batch is committed, and journal
segments wholly stored are deleted. A session's records are stored as a difference to
its root record (``record/roots.py``: the lists' tails after the root's first segments).
A record's segment lists are encoded once, by the
journal: its line holds them as they were encoded, and its row in the store is made of
them (a batch loaded back from the journal's files encodes them again). When the store
fails (unreachable, or a statement or lock wait past its timeout: a stalled store is a
failed store), nothing moves: the records wait in the journal, and the store is tried
again every ``retry_interval``. What a previous run left in the journal (a crash, a
shutdown while the store was down) is stored first. Stores write each ``request_id`` once, so replaying a stored record stores nothing.

``close()`` gives the store at most ``close_timeout`` to take what is pending (a store
that failed a moment before is tried once more, not left to its retry), then stops: the
rest is already on disk, for the next start. A store call that hangs is left
behind in its (daemon) thread; it never holds up the process's exit.

Records are lost only when the journal refuses them (past ``journal_max_bytes``, or the
disk failing: ``dropped``, logged), and when the store refuses the data itself (a value
it cannot hold: ``rejected``, logged with the request id; the rest of the batch is
stored). Without a journal (``journal=None``) records wait in a bounded queue in memory
and a crash loses them.

The store calls run in the writer's own worker thread, at a lowered CPU priority (nice
+10, on Linux): on a busy core, the event loop's thread then gets the CPU first when a
packet lands, instead of waiting out the writer's time slice (p99 at c32 with a store:
57 -> 46 ms, docs/performance.md). Should the backlog grow past a few batches, batches go
through a second thread at the process's own priority until it is caught up: an
unprivileged process cannot take a lowered priority back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from prefixgate.ledger.causes import Ledger
from prefixgate.record.backlog import Batch, open_backlog
from prefixgate.record.journal import SegmentsJson
from prefixgate.record.record import Record
from prefixgate.record.roots import SegmentRoots
from prefixgate.store.base import Store, StoreDataError, StoreError
from prefixgate.wake import Wake

log = logging.getLogger(__name__)

StoreFactory = Callable[[], Store]
# Told, once ledgers handed to the writer are settled: how many were written, how many lost.
LedgersSettled = Callable[[int, int], None]


class WriterStats(msgspec.Struct, frozen=True):
    submitted: int  # taken by submit(): in the journal (without one, the queue)
    written: int  # committed to the store (a record replayed after a crash counts again)
    dropped: int  # refused by submit(): the journal full or failing, the queue full, closed
    rejected: int  # refused by the store for their data (logged)
    pending: int  # not yet in the store (a previous run's backlog included)
    journal_bytes: int
    store_ok: bool


BACKGROUND_NICE = 10  # added to the writer thread's nice value


def _lower_priority() -> None:
    """Lower the calling thread's CPU priority (Linux: nice is per thread)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            tid = threading.get_native_id()
            os.setpriority(
                os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE
            )


class RecordWriter:
    def __init__(
        self,
        store: Store | StoreFactory,
        *,
        journal: str | os.PathLike[str] | None = "prefixgate-journal",
        journal_max_bytes: int = 1 << 30,
        journal_segment_bytes: int = 0,
        batch_size: int = 500,
        flush_interval: float = 0.2,
        queue_max: int = 10_000,
        retry_interval: float = 2.0,
        close_timeout: float = 5.0,
    ) -> None:
        if isinstance(store, Store):
            self._store: Store | None = store
            self._factory: StoreFactory | None = None
        else:
            self._store = None
            self._factory = store
        self._migrated = False
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.retry_interval = retry_interval
        self.close_timeout = close_timeout
        # queue_max: the records kept in memory (the journal's mirrored tail, or the queue)
        self._backlog = open_backlog(
            journal,
            max_records=queue_max,
            max_bytes=journal_max_bytes,
            segment_bytes=journal_segment_bytes,
        )
        self._wake = Wake()  # a record came (when idle) or a batch is full
        self._stop = Wake()  # close() was called
        self._task: asyncio.Task[None] | None = None
        self._closing = self._closed = False
        self._retry_at = 0.0  # monotonic time before which the store is not tried again
        self._tried_at_close = False  # a failed store was tried once more by close()
        self.submitted = self.written = self.dropped = self.rejected = 0
        self._threads: dict[bool, CallThread] = {}  # behind? -> its worker thread
        self.queue_max = queue_max
        # miss ledgers handed over (take_ledgers), written in the next batch's transaction
        self._ledgers: list[Ledger] = []
        self._ledgers_settled: LedgersSettled | None = None
        # each session's root record: later records stored as a difference to it
        self._roots = SegmentRoots()

    @classmethod
    def from_config(cls, store) -> RecordWriter:
        """The writer of a ``store:`` section (config.StoreConfig)."""
        from prefixgate.store import open_store

        dsn, statement, lock = store.dsn, store.statement_timeout, store.lock_timeout
        return cls(
            lambda: open_store(dsn, statement_timeout=statement, lock_timeout=lock),
            journal=store.journal_path,
            journal_max_bytes=int(store.journal_max_mb * (1 << 20)),
            close_timeout=store.close_timeout,
        )

    # -- request path ------------------------------------------------------------------
    def submit(self, record: Record) -> None:
        """Journal a record for the store. Never blocks on the store, never raises. Call
        it from the event loop's thread, once the record's answer is complete."""
        try:
            if self._closed:
                self.dropped += 1
                return
            stored = self._roots.stored(record)
            if not self._backlog.append(stored):
                self._roots.forget(stored)
                self.dropped += 1
                return
            self.submitted += 1
            n = self._backlog.pending
            if n == 1 or n >= self.batch_size:
                self._wake.set()
        except Exception:  # the request path must never see an error
            log.exception("record writer: a record could not be journaled")
            self.dropped += 1

    def take_ledgers(self, ledgers: list[Ledger], settled: LedgersSettled) -> bool:
        """Miss ledgers (``ledger/worker.py``) to write in the transaction of the next
        batch of records (a turn's ledger is computed while the writer waits for its
        record's batch to fill), or alone when no record is pending. Derived data: kept in
        memory (at most ``queue_max``, the oldest dropped) until written, across the
        store's outages. ``settled`` is told what was written and lost. False when the
        writer is closing: the caller writes them itself."""
        if self._closing or self._closed:
            return False
        self._ledgers_settled = settled
        self._ledgers += ledgers
        self._bound_ledgers()
        if not self._backlog.pending:
            self._wake.set()
        return True

    @property
    def ledgers_pending(self) -> int:
        return len(self._ledgers)

    def _bound_ledgers(self) -> None:
        over = len(self._ledgers) - self.queue_max
        if over > 0:
            del self._ledgers[:over]
            self._settle_ledgers(0, over)

    def _settle_ledgers(self, written: int, lost: int) -> None:
        if self._ledgers_settled is not None and (written or lost):
            try:
                self._ledgers_settled(written, lost)
            except Exception:
                log.exception("record writer: a ledgers' callback failed")

    def stats(self) -> WriterStats:
        return WriterStats(
            submitted=self.submitted,
            written=self.written,
            dropped=self.dropped,
            rejected=self.rejected,
            pending=self._backlog.pending,
            journal_bytes=self._backlog.bytes,
            store_ok=self._retry_at == 0.0,
        )

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Open the journal (taking over what a previous run left in it) and start the
        background task, which stores that backlog first."""
        if self._task is not None:
            return
        backlog = await self._off(self._backlog.open)
        if backlog:
            log.info(
                "record journal %s: %d records from an earlier run go to the store first",
                self._backlog.where,
                backlog,
            )
        self._task = asyncio.create_task(self._run(), name="prefixgate-record-writer")

    async def close(self, timeout: float | None = None) -> None:
        """Store what is pending within ``timeout`` (default ``close_timeout``), then stop;
        whatever the store did not take stays in the journal for the next start. Also
        closes the store if the writer built it from a factory. Used on shutdown."""
        deadline = time.monotonic() + (self.close_timeout if timeout is None else timeout)
        self._closing = True
        self._stop.set()
        self._wake.set()
        idle = True
        if self._task is not None:
            try:
                async with asyncio.timeout(_left(deadline)):
                    await asyncio.shield(self._task)
            except TimeoutError:  # the store hangs: its thread is left behind
                idle = False
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            self._task = None
        self._closed = True
        if self._ledgers:  # derived data, not journaled: lost with the process
            self._settle_ledgers(0, len(self._ledgers))
            self._ledgers = []
        left = self._backlog.close()
        if left:
            log.warning(
                "record writer stopped with %d records not in the store; they are in %s",
                left,
                self._backlog.where if self._backlog.where != "memory" else "no journal: lost",
            )
        if idle and self._factory is not None and self._store is not None:
            # A store the writer built is the writer's to close; a given one is the caller's.
            store, self._store = self._store, None
            with contextlib.suppress(Exception):
                async with asyncio.timeout(max(_left(deadline), 0.5)):
                    await self._off(store.close)
        self._stop_threads()

    # -- worker threads ----------------------------------------------------------------
    def _off(self, fn, *args) -> asyncio.Future[Any]:
        """``fn(*args)`` in a worker thread, awaited: the lowered-priority one, or the one
        at the process's priority while the backlog is more than a few batches behind."""
        behind = self._backlog.pending > 4 * self.batch_size
        worker = self._threads.get(behind)
        if worker is None:
            worker = self._threads[behind] = CallThread(
                "prefixgate-records" + ("-catch-up" if behind else ""), lowered=not behind
            )
        return worker.call(fn, *args)

    def _stop_threads(self) -> None:
        threads, self._threads = self._threads, {}
        for worker in threads.values():
            worker.stop()

    # -- background task ---------------------------------------------------------------
    async def _run(self) -> None:
        backlog = self._backlog
        while True:
            if not backlog.pending and not self._ledgers:
                if self._closing:
                    return
                await self._sleep(None, self._wake)
                continue
            wait = self._retry_at - time.monotonic()
            if wait > 0:  # the store failed a moment ago
                if not self._closing:
                    await self._sleep(wait, self._stop)
                    continue
                if self._tried_at_close:
                    return  # what is pending is in the journal already
                # Closing: one more try, within close()'s timeout. The failure may have
                # been a lock another worker held on the same store, gone by now.
                self._tried_at_close = True
            if backlog.pending < self.batch_size and not self._closing:
                # Let a batch fill up for flush_interval; submit() wakes us when it is full.
                await self._sleep(self.flush_interval, self._wake)
            try:
                await self._write_next()
            except Exception as exc:  # a bug, not an outage: keep the writer alive
                log.exception("record writer failed")
                self._store_failed(exc)

    async def _sleep(self, timeout: float | None, event: Wake) -> None:
        if event is self._wake:
            event.clear()
        await event.wait(timeout)

    async def _write_next(self) -> None:
        backlog = self._backlog
        batch = backlog.take(self.batch_size)
        if batch is None:
            batch = await self._off(backlog.load, self.batch_size, backlog.snapshot())
        ledgers, self._ledgers = self._ledgers, []
        if (batch.records or ledgers) and not await self._store_batch(batch, ledgers):
            self._ledgers = ledgers + self._ledgers  # tried again with the next batch
            self._bound_ledgers()
            return
        self._settle_ledgers(len(ledgers), 0)
        done = backlog.commit(batch)
        if done:
            await self._off(backlog.delete, done)

    async def _store_batch(self, batch: Batch, ledgers: list[Ledger]) -> bool:
        try:
            rejected = await self._off(self._write_sync, batch.records, batch.segments, ledgers)
        except Exception as exc:
            self._store_failed(exc)
            return False
        if self._retry_at:
            log.warning("record store is back; %d records to store", self._backlog.pending)
        self._retry_at = 0.0
        self.written += len(batch.records) - len(rejected)
        if rejected:
            self.rejected += len(rejected)
            for record, _ in rejected:
                self._roots.forget(record)  # no later record builds on a root not stored
            log.error(
                "record store refused %d records for their data; not stored: %s",
                len(rejected),
                ", ".join(f"{r.request_id} ({why})" for r, why in rejected),
            )
        return True

    def _write_sync(
        self,
        records: list[Record],
        segments: list[SegmentsJson] | None = None,
        ledgers: list[Ledger] | None = None,
    ) -> list[tuple[Record, str]]:
        """Write a batch (and ``ledgers``, in its transaction); when the store refuses its
        data, the ledgers alone, then each record alone, to find the ones it refuses
        (returned, with the reason) and store the rest. ``segments``: the records' segment
        lists as the journal encoded them, when it did."""
        store = self._store
        if store is None:
            if self._factory is None:
                raise RuntimeError("writer is closed")
            store = self._store = self._factory()
            self._migrated = False
        if not self._migrated:
            store.migrate()
            self._migrated = True
        try:
            if ledgers:
                store.write_batch(records, segments=segments, ledgers=ledgers)
            else:
                store.write_batch(records, segments=segments)
            return []
        except StoreDataError as exc:
            if ledgers:
                try:
                    store.write_ledgers(ledgers)
                except StoreDataError as why:  # derived data: logged, not kept
                    log.error("record store refused %d ledgers: %s", len(ledgers), why)
            if not records:
                return []
            if ledgers:
                try:
                    store.write_batch(records, segments=segments)
                    return []
                except StoreDataError:
                    pass
            if len(records) == 1:
                return [(records[0], str(exc))]
        refused = []
        for i, record in enumerate(records):
            try:
                store.write_batch([record], segments=None if segments is None else [segments[i]])
            except StoreDataError as exc:
                refused.append((record, str(exc)))
        return refused

    def _store_failed(self, exc: Exception) -> None:
        if self._retry_at == 0.0:
            log.warning(
                "record store failed, records wait in the journal %s: %s",
                self._backlog.where,
                exc if isinstance(exc, StoreError) else repr(exc),
            )
        self._retry_at = time.monotonic() + self.retry_interval
        if self._factory is not None and self._store is not None:
            # Build a fresh store (new connection, maybe new settings) on the next try.
            store, self._store = self._store, None
            with contextlib.suppress(Exception):
                store.close()


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


class CallThread:
    """One daemon thread running calls in order, each awaited as a future. A daemon (not
    an executor's thread, which the interpreter joins at exit): a store call stuck on a
    hung server never holds the process up once it means to exit."""

    def __init__(self, name: str, *, lowered: bool) -> None:
        self._calls: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, args=(lowered,), name=name, daemon=True)
        self._thread.start()

    def call(self, fn, *args) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._calls.put((fn, args, future, loop))
        return future

    def stop(self) -> None:
        self._calls.put(None)

    def _run(self, lowered: bool) -> None:
        if lowered:
            _lower_priority()
        while (item := self._calls.get()) is not None:
            fn, args, future, loop = item
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # handed to the awaiting task
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, future, result, error)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
