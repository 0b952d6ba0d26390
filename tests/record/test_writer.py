"""The record writer: everything submitted ends up in the store exactly once, through
store outages (spool and replay), restarts (spool left on disk) and shutdown."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest

from prefixgate.record.model import Record, Segment
from prefixgate.record.writer import BACKGROUND_NICE, RecordWriter
from prefixgate.store import Store, StoreError, open_store
from prefixgate.store.postgres import PostgresStore
from prefixgate.store.sqlite import SqliteStore
from tests.store.conftest import pg_schema_dsn

FAST = {"flush_interval": 0.01, "retry_interval": 0.02}


def make(i: int) -> Record:
    h = f"{i:032x}"
    return Record(
        request_id=f"req-{i:06d}",
        received_at=1_700_000_000.0 + i,
        endpoint="messages",
        session_id=f"s{i % 7}",
        segments_in=[Segment("message", "messages[0]:user", h, 8, 2)],
        texts={h: f'{{"n":{i}}}'},
    )


class FlakyStore(Store):
    """Delegates to a real store, but fails while ``down`` is set (and counts calls)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.down = threading.Event()
        self.fail_after: int | None = None  # fail every write after this many successes
        self.writes = 0

    def _check(self) -> None:
        if self.down.is_set():
            raise StoreError("store is down (test)")

    def migrate(self, target=None):
        self._check()
        return self.inner.migrate(target)

    def schema_version(self):
        return self.inner.schema_version()

    def write_batch(self, records):
        self._check()
        if self.fail_after is not None and self.writes >= self.fail_after:
            raise StoreError("store failed midway (test)")
        self.inner.write_batch(records)
        self.writes += 1

    def count(self):
        return self.inner.count()

    def iter_records(self, since=None, until=None, *, with_texts=False):
        return self.inner.iter_records(since, until, with_texts=with_texts)

    def get_texts(self, hashes):
        return self.inner.get_texts(hashes)

    def prune(self, older_than_seconds, *, now=None):
        return self.inner.prune(older_than_seconds, now=now)

    def close(self):
        pass  # the test owns the inner store


def ids(store: Store) -> list[str]:
    return sorted(r.request_id for r in store.iter_records())


def expected(n: int) -> list[str]:
    return [f"req-{i:06d}" for i in range(n)]


async def wait_until(cond, limit: float = 30.0) -> None:
    """Poll a condition (a generous limit, not a timing assertion)."""
    for _ in range(int(limit / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


@pytest.fixture
def sqlite_store(tmp_path: Path):
    store = SqliteStore(tmp_path / "w.db")
    store.migrate()
    yield store
    store.close()


def test_concurrent_submits_all_written(sqlite_store: SqliteStore, tmp_path: Path) -> None:
    n = 5000

    async def main() -> None:
        writer = RecordWriter(sqlite_store, batch_size=128, spool_path=tmp_path / "spool", **FAST)
        await writer.start()

        async def client(k: int) -> None:
            for i in range(k, n, 50):
                writer.submit(make(i))
                if i % 7 == 0:
                    await asyncio.sleep(0)

        await asyncio.gather(*(client(k) for k in range(50)))
        await writer.close(timeout=60)
        stats = writer.stats()
        assert (stats.queued, stats.written, stats.spooled, stats.dropped) == (n, n, 0, 0)
        assert stats.queue_depth == 0

    asyncio.run(main())
    assert sqlite_store.count() == n
    assert ids(sqlite_store) == expected(n)


def test_store_down_midway_spools_then_replays(sqlite_store: SqliteStore, tmp_path: Path) -> None:
    flaky = FlakyStore(sqlite_store)
    spool = tmp_path / "spool.jsonl"

    async def main() -> None:
        writer = RecordWriter(flaky, batch_size=50, spool_path=spool, **FAST)
        await writer.start()
        for i in range(300):
            writer.submit(make(i))
        await wait_until(lambda: writer.stats().written == 300)
        flaky.down.set()
        for i in range(300, 900):
            writer.submit(make(i))
            if i % 40 == 0:
                await asyncio.sleep(0)
        await wait_until(lambda: writer.stats().spooled == 600)
        assert spool.stat().st_size > 0
        assert not writer.stats().store_ok
        flaky.down.clear()
        for i in range(900, 1000):
            writer.submit(make(i))
        await wait_until(lambda: writer.stats().written == 1000)
        assert writer.stats().spool_pending == 0
        await writer.close(timeout=60)

    asyncio.run(main())
    assert spool.stat().st_size == 0
    assert sqlite_store.count() == 1000
    assert ids(sqlite_store) == expected(1000)


def test_unreachable_postgres_then_back(pg_database: str, tmp_path: Path) -> None:
    good = pg_schema_dsn(pg_database)
    wrong_port = good.replace(":5432/", ":1/")
    assert wrong_port != good
    target = {"dsn": wrong_port}
    spool = tmp_path / "spool.jsonl"

    def factory() -> Store:
        return open_store(target["dsn"])

    async def main() -> None:
        writer = RecordWriter(factory, batch_size=100, spool_path=spool, **FAST)
        await writer.start()
        for i in range(500):
            writer.submit(make(i))
        await wait_until(lambda: writer.stats().spooled == 500)
        assert writer.stats().written == 0
        target["dsn"] = good  # the database is back
        for i in range(500, 700):
            writer.submit(make(i))
        await writer.close(timeout=60)
        stats = writer.stats()
        assert stats.written == 700 and stats.dropped == 0 and stats.spool_pending == 0

    asyncio.run(main())
    with PostgresStore(good) as store:
        assert store.count() == 700
        assert ids(store) == expected(700)
        assert len(store.get_texts(f"{i:032x}" for i in range(700))) == 700


def test_spool_left_by_a_previous_run_is_replayed_at_start(
    sqlite_store: SqliteStore, tmp_path: Path
) -> None:
    spool = tmp_path / "spool.jsonl"
    down = FlakyStore(sqlite_store)
    down.down.set()

    async def first_run() -> None:
        writer = RecordWriter(down, spool_path=spool, **FAST)
        await writer.start()
        for i in range(250):
            writer.submit(make(i))
        await writer.close(timeout=60)  # store still down: everything goes to the spool
        assert writer.stats().spooled == 250

    asyncio.run(first_run())
    assert sqlite_store.count() == 0
    lines = spool.read_bytes().splitlines()
    assert len(lines) == 250
    # a crash mid-append leaves a torn last line: it is skipped
    spool.write_bytes(spool.read_bytes() + lines[0][:20])

    async def second_run() -> None:
        writer = RecordWriter(sqlite_store, batch_size=64, spool_path=spool, **FAST)
        await writer.start()
        assert writer.stats().written == 250
        writer.submit(make(250))
        await writer.close(timeout=60)

    asyncio.run(second_run())
    assert spool.stat().st_size == 0
    assert ids(sqlite_store) == expected(251)
    assert sqlite_store.get_texts([f"{7:032x}"]) == {f"{7:032x}": '{"n":7}'}


def test_replay_failing_midway_keeps_the_rest_in_order(
    sqlite_store: SqliteStore, tmp_path: Path
) -> None:
    spool = tmp_path / "spool.jsonl"
    enc = msgspec.json.Encoder()
    spool.write_bytes(b"".join(enc.encode(make(i)) + b"\n" for i in range(100)))
    flaky = FlakyStore(sqlite_store)
    flaky.fail_after = 2  # two batches of 10 go in, then the store fails

    async def main() -> None:
        writer = RecordWriter(flaky, batch_size=10, spool_path=spool, **FAST)
        await writer.start()
        assert writer.stats().written == 20
        assert writer.stats().spool_pending == 80
        remaining = [
            msgspec.json.decode(line, type=Record).request_id
            for line in spool.read_bytes().splitlines()
        ]
        assert remaining == expected(100)[20:]
        flaky.fail_after = None
        await wait_until(lambda: writer.stats().spool_pending == 0)
        await writer.close(timeout=60)
        assert writer.stats().written == 100

    asyncio.run(main())
    assert ids(sqlite_store) == expected(100)


def test_replaying_an_already_written_spool_stores_nothing_twice(
    sqlite_store: SqliteStore, tmp_path: Path
) -> None:
    """A crash between the store's commit and the spool's truncation replays written
    records: the store is idempotent per request_id."""
    sqlite_store.migrate()
    sqlite_store.write_batch([make(i) for i in range(30)])
    spool = tmp_path / "spool.jsonl"
    enc = msgspec.json.Encoder()
    spool.write_bytes(b"".join(enc.encode(make(i)) + b"\n" for i in range(40)))

    async def main() -> None:
        writer = RecordWriter(sqlite_store, spool_path=spool, **FAST)
        await writer.start()
        await writer.close(timeout=60)

    asyncio.run(main())
    assert sqlite_store.count() == 40
    assert ids(sqlite_store) == expected(40)


def test_full_queue_drops_and_never_raises(sqlite_store: SqliteStore, tmp_path: Path) -> None:
    async def main() -> None:
        writer = RecordWriter(sqlite_store, queue_max=10, spool_path=tmp_path / "spool", **FAST)
        for i in range(25):  # not started: nothing drains the queue
            writer.submit(make(i))
        stats = writer.stats()
        assert (stats.queued, stats.dropped, stats.queue_depth) == (10, 15, 10)
        await writer.start()
        await writer.close(timeout=60)
        assert writer.stats().written == 10
        writer.submit(make(99))  # after close: counted as dropped, no exception
        assert writer.stats().dropped == 16

    asyncio.run(main())
    assert sqlite_store.count() == 10


def test_close_timeout_with_a_hung_store_keeps_records_on_disk(
    sqlite_store: SqliteStore, tmp_path: Path
) -> None:
    release = threading.Event()

    class HungStore(FlakyStore):
        def write_batch(self, records):
            release.wait(30)
            super().write_batch(records)

    hung = HungStore(sqlite_store)
    spool = tmp_path / "spool.jsonl"

    async def main() -> None:
        writer = RecordWriter(hung, batch_size=10, spool_path=spool, **FAST)
        await writer.start()
        for i in range(35):
            writer.submit(make(i))
        await writer.close(timeout=0.3)
        assert writer.stats().queue_depth == 0
        release.set()  # let the stuck worker thread end before the loop shuts down

    asyncio.run(main())
    spooled = {
        msgspec.json.decode(line, type=Record).request_id
        for line in spool.read_bytes().splitlines()
    }
    assert spooled == set(expected(35))  # the in-flight batch too; replay is idempotent

    async def restart() -> None:
        writer = RecordWriter(sqlite_store, spool_path=spool, **FAST)
        await writer.start()
        await writer.close(timeout=60)

    asyncio.run(restart())
    assert ids(sqlite_store) == expected(35)


class NiceProbe(FlakyStore):
    """Notes the CPU priority (nice) of the thread each batch is written from."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.nices: list[tuple[int, int]] = []  # (nice, batch size)
        self.gate = threading.Event()
        self.gate.set()

    def write_batch(self, records):
        self.gate.wait(30)
        tid = threading.get_native_id()
        self.nices.append((os.getpriority(os.PRIO_PROCESS, tid), len(records)))
        super().write_batch(records)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_batches_are_written_at_lowered_priority_unless_far_behind(
    sqlite_store: SqliteStore, tmp_path: Path
) -> None:
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    probe = NiceProbe(sqlite_store)

    async def main() -> None:
        writer = RecordWriter(probe, batch_size=10, spool_path=tmp_path / "spool", **FAST)
        await writer.start()
        for i in range(5):
            writer.submit(make(i))
        await _until(lambda: writer.written == 5)
        assert probe.nices and all(n == own + BACKGROUND_NICE for n, _ in probe.nices)
        # The store stalls while 200 records (20 batches) pile up: the batches that find
        # the queue more than 4 batches deep go at the process's own priority.
        probe.gate.clear()
        writer.submit(make(5))
        await _until(lambda: writer.stats().queue_depth == 0)  # its batch is in the store
        for i in range(6, 206):
            writer.submit(make(i))
        probe.gate.set()
        await writer.close(timeout=60)
        assert writer.written == 206
        assert sorted(r for r in ids(sqlite_store)) == sorted(
            make(i).request_id for i in range(206)
        )
        later = probe.nices[len(probe.nices) - 20 :]
        assert any(n == own for n, _ in later), probe.nices
        assert probe.nices[-1] == (own + BACKGROUND_NICE, probe.nices[-1][1])  # caught up

    asyncio.run(main())


async def _until(cond, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)
