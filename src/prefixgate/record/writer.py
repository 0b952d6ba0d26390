"""The record writer: one asynchronous, batched writer, off the request path.

``submit()`` appends to an in-memory queue and returns; a background task groups records
into batches (up to ``batch_size``, or whatever arrived within ``flush_interval``) and
writes each batch in a worker thread. When the store fails, the batch is appended to a
local spool file (JSON lines, fsync'd) and the store is retried every ``retry_interval``;
once it answers, the spool is replayed in order and truncated, before newer batches. A
spool left by a previous run is replayed at start. Stores are idempotent per request_id,
so a batch written twice (a crash between the store's commit and the spool's truncation)
is stored once.

Records are lost only when the queue is full (``dropped``) or when the spool cannot be
written either (``lost``).

The store and spool calls run in the writer's own worker thread, at a lowered CPU priority
(nice +10, on Linux): on a busy core, the event loop's thread then gets the CPU first
when a packet lands, instead of waiting out the writer's time slice (p99 at c32 with a
store: 57 -> 46 ms, docs/performance.md). Should the queue grow past a few batches,
batches go through a second thread at the process's own priority until it is caught up:
an unprivileged process cannot take a lowered priority back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import msgspec

from prefixgate.record.model import Record
from prefixgate.store.base import Store

log = logging.getLogger(__name__)

StoreFactory = Callable[[], Store]


class WriterStats(msgspec.Struct, frozen=True):
    queued: int  # accepted by submit()
    written: int  # committed to the store
    spooled: int  # appended to the spool file (a record may be spooled once per outage)
    dropped: int  # refused by submit() because the queue was full (or writer closed)
    lost: int  # neither stored nor spooled (the spool file failed too)
    queue_depth: int
    spool_pending: int  # records in the spool waiting for the store
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
        batch_size: int = 500,
        flush_interval: float = 0.2,
        queue_max: int = 100_000,
        spool_path: str | os.PathLike[str] = "prefixgate-spool.jsonl",
        retry_interval: float = 2.0,
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
        self.queue_max = queue_max
        self.retry_interval = retry_interval
        self.spool_path = Path(spool_path)
        self._queue: collections.deque[Record] = collections.deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._retry_at = 0.0  # monotonic time before which the store is not tried again
        self._spool_pending = 0
        self._inflight: list[Record] = []  # the batch being stored or spooled
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(Record)
        self.queued = self.written = self.spooled = self.dropped = self.lost = 0
        self._threads: dict[bool, ThreadPoolExecutor] = {}  # behind? -> its worker thread

    # -- request path ------------------------------------------------------------------
    def submit(self, record: Record) -> None:
        """Queue a record for writing. Never blocks, never raises. Call it from the event
        loop's thread."""
        try:
            if self._closing or len(self._queue) >= self.queue_max:
                self.dropped += 1
                return
            self._queue.append(record)
            self.queued += 1
            n = len(self._queue)
            if n == 1 or n >= self.batch_size:
                self._wake.set()
        except Exception:  # pragma: no cover - the request path must never see an error
            self.dropped += 1

    def stats(self) -> WriterStats:
        return WriterStats(
            queued=self.queued,
            written=self.written,
            spooled=self.spooled,
            dropped=self.dropped,
            lost=self.lost,
            queue_depth=len(self._queue),
            spool_pending=self._spool_pending,
            store_ok=self._retry_at == 0.0,
        )

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Start the background task; first replay any spool a previous run left."""
        if self._task is not None:
            return
        self._spool_pending = await self._off(self._count_spool)
        if self._spool_pending:
            await self._replay_spool_safely()
        self._task = asyncio.create_task(self._run(), name="prefixgate-record-writer")

    async def close(self, timeout: float = 10.0) -> None:
        """Write everything queued (to the store, or to the spool if the store fails or
        ``timeout`` runs out), then close the store if the writer built it from a factory.
        Used on shutdown (SIGTERM)."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            self._task = None
        if self._queue or self._inflight:  # never started, or timed out: keep the rest on disk
            rest = self._inflight + list(self._queue)
            self._inflight = []
            self._queue.clear()
            await self._off(self._spool, rest)
        if self._factory is not None and self._store is not None:
            # A store the writer built is the writer's to close; a given one is the caller's.
            store, self._store = self._store, None
            with contextlib.suppress(Exception):
                await self._off(store.close)
        self._stop_threads()

    # -- worker threads ----------------------------------------------------------------
    def _off(self, fn, *args):
        """``fn(*args)`` in a worker thread, awaited: the lowered-priority one, or the one
        at the process's priority while the queue is more than a few batches behind."""
        behind = len(self._queue) > 4 * self.batch_size
        pool = self._threads.get(behind)
        if pool is None:
            pool = self._threads[behind] = ThreadPoolExecutor(
                1,
                thread_name_prefix="prefixgate-records" + ("-catch-up" if behind else ""),
                initializer=None if behind else _lower_priority,
            )
        return asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    def _stop_threads(self) -> None:
        threads, self._threads = self._threads, {}
        for pool in threads.values():
            pool.shutdown(wait=False)

    # -- background task ---------------------------------------------------------------
    async def _run(self) -> None:
        queue = self._queue
        while True:
            if not queue:
                if self._closing:
                    break
                self._wake.clear()
                idle = self.retry_interval if self._spool_pending else None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(idle):
                        await self._wake.wait()
                if not queue and self._spool_pending and self._may_try():
                    await self._replay_spool_safely()
                continue
            if len(queue) < self.batch_size and not self._closing:
                # Let a batch fill up for flush_interval; submit() wakes us when it is full.
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.flush_interval):
                        await self._wake.wait()
            n = min(len(queue), self.batch_size)
            batch = self._inflight = [queue.popleft() for _ in range(n)]
            try:
                await self._write(batch)
            except Exception:  # a bug, not an outage: keep the writer alive
                log.exception("record writer lost a batch of %d records", len(batch))
                self.lost += len(batch)
            self._inflight = []
        if self._spool_pending:  # a last chance for what the spool holds
            await self._replay_spool_safely()

    def _may_try(self) -> bool:
        return time.monotonic() >= self._retry_at

    async def _write(self, batch: list[Record]) -> None:
        if self._spool_pending:
            # Older records wait in the spool: they go first, to keep the order.
            if self._may_try():
                await self._replay_spool()
            if self._spool_pending:
                await self._off(self._spool, batch)
                return
        elif not self._may_try():
            await self._off(self._spool, batch)
            return
        if await self._store_batch(batch):
            return
        await self._off(self._spool, batch)

    async def _store_batch(self, batch: list[Record]) -> bool:
        try:
            await self._off(self._write_sync, batch)
        except Exception as exc:
            self._store_failed(exc)
            return False
        self.written += len(batch)
        self._retry_at = 0.0
        return True

    def _write_sync(self, batch: list[Record]) -> None:
        store = self._store
        if store is None:
            if self._factory is None:
                raise RuntimeError("writer is closed")
            store = self._store = self._factory()
            self._migrated = False
        if not self._migrated:
            store.migrate()
            self._migrated = True
        store.write_batch(batch)

    def _store_failed(self, exc: Exception) -> None:
        if self._retry_at == 0.0:
            log.warning("record store failed, spooling to %s: %s", self.spool_path, exc)
        self._retry_at = time.monotonic() + self.retry_interval
        if self._factory is not None and self._store is not None:
            # Build a fresh store (new connection, maybe new settings) on the next try.
            store, self._store = self._store, None
            with contextlib.suppress(Exception):
                store.close()

    # -- spool -------------------------------------------------------------------------
    def _spool(self, batch: list[Record]) -> None:
        """Append a batch to the spool file, fsync'd (runs in a worker thread)."""
        data = b"".join(self._encoder.encode(r) + b"\n" for r in batch)
        try:
            self.spool_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.spool_path, "ab") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            self.lost += len(batch)
            log.error(
                "record spool %s failed, %d records lost: %s", self.spool_path, len(batch), exc
            )
            return
        self.spooled += len(batch)
        self._spool_pending += len(batch)

    def _count_spool(self) -> int:
        try:
            with open(self.spool_path, "rb") as f:
                return sum(1 for line in f if line.strip())
        except FileNotFoundError:
            return 0

    async def _replay_spool_safely(self) -> None:
        try:
            await self._replay_spool()
        except Exception:  # e.g. the spool file unreadable: it stays for the next run
            log.exception("replaying record spool %s failed", self.spool_path)
            self._retry_at = time.monotonic() + self.retry_interval

    async def _replay_spool(self) -> None:
        """Write the spool to the store in order, batch by batch; truncate it when all is
        written, or keep only the unwritten rest when the store fails midway."""
        try:
            f = open(self.spool_path, "rb")  # noqa: SIM115 - closed below, across awaits
        except FileNotFoundError:
            self._spool_pending = 0
            return
        with f:
            while True:
                start = f.tell()
                batch = await self._off(self._read_batch, f)
                if not batch:
                    break
                if not await self._store_batch(batch):
                    if start > 0:  # drop what is written; nothing to do if nothing was
                        await self._off(self._keep_rest, f, start)
                    return
                self._spool_pending = max(0, self._spool_pending - len(batch))
        with open(self.spool_path, "r+b") as f:
            f.truncate(0)
            os.fsync(f.fileno())
        self._spool_pending = 0

    def _read_batch(self, f: BinaryIO) -> list[Record]:
        batch: list[Record] = []
        while line := f.readline():
            if not line.strip():
                continue
            try:
                batch.append(self._decoder.decode(line))
            except msgspec.DecodeError:  # a torn last line from a crash: skip it
                log.warning("skipping an unreadable line in record spool %s", self.spool_path)
                continue
            if len(batch) >= self.batch_size:
                break
        return batch

    def _keep_rest(self, f: BinaryIO, start: int) -> None:
        """Rewrite the spool with its lines from byte ``start`` on (atomically)."""
        f.seek(start)
        tmp = self.spool_path.with_name(self.spool_path.name + ".tmp")
        with open(tmp, "wb") as out:
            while chunk := f.read(1 << 20):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.spool_path)
        self._spool_pending = self._count_spool()
