"""The record writer: everything submitted ends up in the store exactly once, through
store outages (records wait in the journal), restarts and kills (the journal is replayed),
a hung store (close() does not wait for it) and data the store refuses."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest

from prefixgate.record import backlog
from prefixgate.record.record import Record, Segment
from prefixgate.record.writer import BACKGROUND_NICE, RecordWriter
from prefixgate.store import Store, StoreError, open_store
from prefixgate.store.postgres import PostgresStore
from prefixgate.store.sqlite import SqliteStore
from tests.store.conftest import pg_schema_dsn

FAST = {"flush_interval": 0.01, "retry_interval": 0.02}


def make(i: int, **over) -> Record:
    h = f"{i:032x}"
    fields = dict(
        request_id=f"req-{i:06d}",
        received_at=1_700_000_000.0 + i,
        endpoint="messages",
        session_id=f"s{i % 7}",
        segments_in=[Segment("message", "messages[0]:user", h, 8, 2)],
        texts={h: f'{{"n":{i}}}'},
    )
    return Record(**{**fields, **over})


class FlakyStore(Store):
    """Delegates to a real store, but fails while ``down`` is set (and counts calls)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.down = threading.Event()
        self.fail_after: int | None = None  # fail every write after this many successes
        self.writes = 0
        self.batches: list[tuple[list[str], list[str]]] = []  # request ids: records, ledgers

    def _check(self) -> None:
        if self.down.is_set():
            raise StoreError("store is down (test)")

    def migrate(self, target=None):
        self._check()
        return self.inner.migrate(target)

    def schema_version(self):
        return self.inner.schema_version()

    def write_batch(self, records, *, segments=None, ledgers=None):
        self._check()
        if self.fail_after is not None and self.writes >= self.fail_after:
            raise StoreError("store failed midway (test)")
        self.inner.write_batch(records, segments=segments, ledgers=ledgers)
        self.writes += 1
        self.batches.append(
            ([r.request_id for r in records], [x.request_id for x in ledgers or ()])
        )

    def write_ledgers(self, ledgers):
        self._check()
        self.inner.write_ledgers(ledgers)

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


def expected(n: int, start: int = 0) -> list[str]:
    return [f"req-{i:06d}" for i in range(start, n)]


def segment_files(journal: Path) -> list[Path]:
    return sorted(journal.glob("*/*.jsonl")) if journal.exists() else []


async def wait_until(cond, limit: float = 60.0) -> None:
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


@pytest.fixture
def down(sqlite_store: SqliteStore) -> FlakyStore:
    """The SQLite store, failing until the test clears ``down.down``."""
    flaky = FlakyStore(sqlite_store)
    flaky.down.set()
    return flaky


def test_concurrent_submits_all_written(sqlite_store: SqliteStore, tmp_path: Path) -> None:
    n = 5000
    journal = tmp_path / "journal"

    async def main() -> None:
        writer = RecordWriter(
            sqlite_store, batch_size=128, journal=journal, journal_segment_bytes=64 << 10, **FAST
        )
        await writer.start()

        async def client(k: int) -> None:
            for i in range(k, n, 50):
                writer.submit(make(i))
                if i % 7 == 0:
                    await asyncio.sleep(0)

        await asyncio.gather(*(client(k) for k in range(50)))
        # Segments rotate as they fill and go once stored: only the tail is on disk.
        await wait_until(lambda: writer.stats().pending == 0)
        assert len(segment_files(journal)) <= 2
        await writer.close(timeout=60)
        stats = writer.stats()
        assert (stats.submitted, stats.written, stats.dropped, stats.pending) == (n, n, 0, 0)

    asyncio.run(main())
    assert sqlite_store.count() == n
    assert ids(sqlite_store) == expected(n)
    assert not journal.exists()  # all stored: a clean stop leaves nothing behind


def test_store_down_midway_records_wait_in_the_journal(
    sqlite_store: SqliteStore, tmp_path: Path
) -> None:
    flaky = FlakyStore(sqlite_store)
    journal = tmp_path / "journal"

    async def main() -> None:
        writer = RecordWriter(
            flaky,
            batch_size=50,
            queue_max=200,
            journal=journal,
            journal_segment_bytes=16 << 10,
            **FAST,
        )
        await writer.start()
        for i in range(300):
            writer.submit(make(i))
        await wait_until(lambda: writer.stats().written == 300)
        flaky.down.set()
        for i in range(300, 900):
            writer.submit(make(i))
            if i % 40 == 0:
                await asyncio.sleep(0)
        await wait_until(lambda: not writer.stats().store_ok)
        assert writer.stats().pending == 600
        # 600 records outgrow the 200 kept in memory: they are read back from the files.
        assert sum(len(p.read_bytes().splitlines()) for p in segment_files(journal)) >= 600
        flaky.down.clear()
        for i in range(900, 1000):
            writer.submit(make(i))
        await wait_until(lambda: writer.stats().pending == 0)
        assert writer.stats().written == 1000 and writer.stats().store_ok
        await writer.close(timeout=60)

    asyncio.run(main())
    assert sqlite_store.count() == 1000
    assert ids(sqlite_store) == expected(1000)
    assert not journal.exists()


def test_close_tries_the_store_once_more_after_a_failed_write(
    sqlite_store: SqliteStore, tmp_path: Path
) -> None:
    """A write that failed a moment before shutdown (a lock held past lock_timeout by
    another worker writing to the same SQLite file) is tried once more by close(),
    within its timeout, instead of leaving the records for the next start; a store still
    failing then is not tried again, and the records stay in the journal."""
    flaky = FlakyStore(sqlite_store)
    journal = tmp_path / "journal"

    async def main(recovers: bool) -> RecordWriter:
        # the retry interval is far past close()'s timeout: only a try at close can store them
        writer = RecordWriter(flaky, journal=journal, flush_interval=0.01, retry_interval=3600)
        await writer.start()
        flaky.down.set()
        for i in range(12):
            writer.submit(make(i))
        await wait_until(lambda: not writer.stats().store_ok)
        if recovers:
            flaky.down.clear()  # the other worker let go of its lock
        await writer.close(timeout=60)
        return writer

    writer = asyncio.run(main(recovers=False))
    assert writer.stats().pending == 12 and sqlite_store.count() == 0
    assert sum(len(p.read_bytes().splitlines()) for p in segment_files(journal)) == 12
    writer = asyncio.run(main(recovers=True))  # the journal's 12 first, then 12 more
    assert writer.stats().pending == 0 and writer.stats().store_ok
    assert ids(sqlite_store) == expected(12)
    assert not journal.exists()


@pytest.mark.postgres
def test_unreachable_postgres_then_back(pg_database: str, tmp_path: Path) -> None:
    good = pg_schema_dsn(pg_database)
    wrong_port = good.replace(":5432/", ":1/")
    assert wrong_port != good
    target = {"dsn": wrong_port}

    def factory() -> Store:
        return open_store(target["dsn"], statement_timeout=5, lock_timeout=2)

    async def main() -> None:
        writer = RecordWriter(factory, batch_size=100, journal=tmp_path / "journal", **FAST)
        await writer.start()
        for i in range(500):
            writer.submit(make(i))
        await wait_until(lambda: not writer.stats().store_ok)
        assert writer.stats().written == 0
        target["dsn"] = good  # the database is back
        for i in range(500, 700):
            writer.submit(make(i))
        await wait_until(lambda: writer.stats().pending == 0)
        await writer.close(timeout=60)
        stats = writer.stats()
        assert stats.written == 700 and stats.dropped == 0

    asyncio.run(main())
    with PostgresStore(good) as store:
        assert store.count() == 700
        assert ids(store) == expected(700)
        assert len(store.get_texts(f"{i:032x}" for i in range(700))) == 700


def test_journal_left_by_a_previous_run_is_stored_at_start(
    sqlite_store: SqliteStore, down: FlakyStore, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"

    async def first_run() -> None:
        writer = RecordWriter(down, journal=journal, **FAST)
        await writer.start()
        for i in range(250):
            writer.submit(make(i))
        await writer.close(timeout=60)  # store still down: everything stays in the journal
        assert writer.stats().pending == 250

    asyncio.run(first_run())
    assert sqlite_store.count() == 0
    (segment,) = segment_files(journal)
    lines = segment.read_bytes().splitlines()
    assert len(lines) == 250
    # a process killed mid-write leaves half a line at the end: it is skipped
    segment.write_bytes(segment.read_bytes() + lines[0][:20])

    async def second_run() -> None:
        writer = RecordWriter(sqlite_store, batch_size=64, journal=journal, **FAST)
        await writer.start()
        assert writer.stats().pending == 250
        writer.submit(make(250))
        await wait_until(lambda: writer.stats().written == 251)
        await writer.close(timeout=60)

    asyncio.run(second_run())
    assert ids(sqlite_store) == expected(251)
    assert sqlite_store.get_texts([f"{7:032x}"]) == {f"{7:032x}": '{"n":7}'}
    assert not journal.exists()


KILLED_RUN = """
import asyncio, os, signal, sys
from tests.record.test_writer import make
from prefixgate.record.writer import RecordWriter
from prefixgate.store import open_store

async def main():
    # the store is a port nothing listens on: records can only be in the journal
    writer = RecordWriter(lambda: open_store("postgresql://postgres@127.0.0.1:1/x"),
                          journal=sys.argv[1], journal_segment_bytes=8192)
    await writer.start()
    for i in range(int(sys.argv[2])):
        writer.submit(make(i))
    print("submitted", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


def test_records_submitted_before_a_sigkill_are_stored_at_the_next_start(
    sqlite_store: SqliteStore, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    n = 400
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, str(journal), str(n)],
        capture_output=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr.decode()
    assert proc.stdout == b"submitted\n"

    async def restart() -> None:
        writer = RecordWriter(sqlite_store, journal=journal, **FAST)
        await writer.start()
        await wait_until(lambda: writer.stats().written == n)
        await writer.close(timeout=60)

    asyncio.run(restart())
    assert ids(sqlite_store) == expected(n)


def test_replaying_records_already_stored_stores_nothing_twice(
    sqlite_store: SqliteStore, down: FlakyStore, tmp_path: Path
) -> None:
    """A process killed after the store's commit, before the journal moved past the
    batch, replays stored records: the store is idempotent per request_id."""
    journal = tmp_path / "journal"

    async def run(store, k: int) -> None:
        writer = RecordWriter(store, journal=journal, **FAST)
        await writer.start()
        for i in range(k):
            writer.submit(make(i))
        if store is not down:
            await wait_until(lambda: writer.stats().pending == 0)
        await writer.close(timeout=60)

    asyncio.run(run(down, 40))  # 40 in the journal
    sqlite_store.write_batch([make(i) for i in range(30)])  # 30 of them stored meanwhile
    asyncio.run(run(sqlite_store, 0))
    assert sqlite_store.count() == 40
    assert ids(sqlite_store) == expected(40)


def test_store_failing_midway_through_a_backlog_keeps_the_rest(
    sqlite_store: SqliteStore, down: FlakyStore, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"

    async def main() -> None:
        writer = RecordWriter(down, batch_size=10, journal=journal, **FAST)
        await writer.start()
        for i in range(100):
            writer.submit(make(i))
        await wait_until(lambda: not writer.stats().store_ok)
        down.fail_after = 2  # two batches of 10 go in, then the store fails
        down.down.clear()
        await wait_until(lambda: writer.stats().written == 20)
        await wait_until(lambda: not writer.stats().store_ok)
        assert writer.stats().pending == 80
        down.fail_after = None
        await wait_until(lambda: writer.stats().pending == 0)
        await writer.close(timeout=60)
        assert writer.stats().written == 100

    asyncio.run(main())
    assert ids(sqlite_store) == expected(100)


def test_a_full_journal_drops_says_so_and_takes_records_again_once_stored(
    sqlite_store: SqliteStore, down: FlakyStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bound = sum(len(msgspec.json.encode(make(i))) + 1 for i in range(40))  # room for 40

    async def main() -> None:
        writer = RecordWriter(down, journal=tmp_path / "journal", journal_max_bytes=bound, **FAST)
        await writer.start()
        for i in range(200):
            writer.submit(make(i))
        stats = writer.stats()
        assert (stats.submitted, stats.dropped) == (40, 160)
        assert stats.journal_bytes <= bound
        full = [r for r in caplog.records if "refuses records" in r.getMessage()]
        assert len(full) == 1 and full[0].levelno == logging.ERROR  # once, not per record
        assert "journal_max_mb" in full[0].getMessage()
        down.down.clear()
        await wait_until(lambda: writer.stats().pending == 0)
        writer.submit(make(999))
        assert writer.stats().submitted == 41
        assert any("takes records again" in r.getMessage() for r in caplog.records)
        await wait_until(lambda: writer.stats().pending == 0)
        await writer.close(timeout=60)

    with caplog.at_level(logging.WARNING, logger="prefixgate.record"):
        asyncio.run(main())
    assert ids(sqlite_store) == [*expected(40), "req-000999"]


def test_close_does_not_wait_for_a_hung_store(sqlite_store: SqliteStore, tmp_path: Path) -> None:
    """A store call that never returns (a server that stopped answering): close() stops
    all the same, the records stay in the journal, and the next start stores them."""
    entered, release = threading.Event(), threading.Event()
    closed = threading.Event()

    class HungStore(FlakyStore):
        def write_batch(self, records, *, segments=None):
            entered.set()
            release.wait(120)
            super().write_batch(records, segments=segments)

    journal = tmp_path / "journal"

    async def main() -> None:
        writer = RecordWriter(HungStore(sqlite_store), batch_size=10, journal=journal, **FAST)
        await writer.start()
        for i in range(35):
            writer.submit(make(i))
        await wait_until(entered.is_set)
        await writer.close(timeout=0.2)
        closed.set()
        assert not release.is_set()  # close() returned while the store call still hangs
        assert writer.stats().pending == 35

    threading.Timer(60, release.set).start()  # a close() that waited would end here
    try:
        asyncio.run(main())
    finally:
        release.set()
    assert closed.is_set()

    async def restart() -> None:
        writer = RecordWriter(sqlite_store, journal=journal, **FAST)
        await writer.start()
        await wait_until(lambda: writer.stats().pending == 0)
        await writer.close(timeout=60)

    asyncio.run(restart())
    assert ids(sqlite_store) == expected(35)  # the hung batch too; stored once


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_record_the_store_refuses_does_not_block_the_others(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, caplog
) -> None:
    """A value the store cannot hold (a NUL in a Postgres text, an integer past 64 bits in
    SQLite) is refused for that record alone, named in the log; the rest is stored."""
    if backend == "sqlite":
        dsn = f"sqlite:///{tmp_path / 'r.db'}"
        bad = {"prompt_tokens": 1 << 70}
    else:
        dsn = pg_schema_dsn(request.getfixturevalue("pg_database"))
        bad = {"requested_model": "a\x00b"}

    async def main() -> None:
        writer = RecordWriter(
            lambda: open_store(dsn), batch_size=20, journal=tmp_path / "j", **FAST
        )
        await writer.start()
        for i in range(60):
            writer.submit(make(i, **(bad if i == 33 else {})))
        await wait_until(lambda: writer.stats().pending == 0)
        await writer.close(timeout=60)
        assert (writer.stats().written, writer.stats().rejected) == (59, 1)

    with caplog.at_level(logging.ERROR, logger="prefixgate.record"):
        asyncio.run(main())
    assert any("req-000033" in r.getMessage() for r in caplog.records)
    with open_store(dsn) as store:
        assert ids(store) == [r for r in expected(60) if r != "req-000033"]


def test_without_a_journal_records_wait_in_memory(
    sqlite_store: SqliteStore, down: FlakyStore, tmp_path: Path
) -> None:

    async def main() -> None:
        writer = RecordWriter(down, journal=None, queue_max=100, **FAST)
        await writer.start()
        for i in range(150):
            writer.submit(make(i))
        assert (writer.stats().submitted, writer.stats().dropped) == (100, 50)
        down.down.clear()
        await wait_until(lambda: writer.stats().pending == 0)
        await writer.close(timeout=60)
        writer.submit(make(999))  # after close: counted as dropped, no exception
        assert writer.stats().dropped == 51

    asyncio.run(main())
    assert ids(sqlite_store) == expected(100)


class NiceProbe(FlakyStore):
    """Notes the CPU priority (nice) of the thread each batch is written from."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.nices: list[tuple[int, int]] = []  # (nice, batch size)
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()

    def write_batch(self, records, *, segments=None):
        self.calls += 1
        self.gate.wait(30)
        tid = threading.get_native_id()
        self.nices.append((os.getpriority(os.PRIO_PROCESS, tid), len(records)))
        super().write_batch(records, segments=segments)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_batches_are_written_at_lowered_priority_unless_far_behind(
    sqlite_store: SqliteStore, tmp_path: Path
) -> None:
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    probe = NiceProbe(sqlite_store)

    async def main() -> None:
        writer = RecordWriter(probe, batch_size=10, journal=tmp_path / "journal", **FAST)
        await writer.start()
        for i in range(5):
            writer.submit(make(i))
        await _until(lambda: writer.written == 5)
        assert probe.nices and all(n == own + BACKGROUND_NICE for n, _ in probe.nices)
        # The store stalls while 200 records (20 batches) pile up: the batches that find
        # the backlog more than 4 batches deep go at the process's own priority.
        probe.gate.clear()
        writer.submit(make(5))
        await _until(lambda: probe.calls == 2)  # its batch waits in the store
        for i in range(6, 206):
            writer.submit(make(i))
        probe.gate.set()
        await _until(lambda: writer.stats().pending == 0)
        await writer.close(timeout=60)
        assert writer.written == 206
        assert ids(sqlite_store) == expected(206)
        later = probe.nices[len(probe.nices) - 20 :]
        assert any(n == own for n, _ in later), probe.nices
        assert probe.nices[-1] == (own + BACKGROUND_NICE, probe.nices[-1][1])  # caught up

    asyncio.run(main())


async def _until(cond, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def test_a_tail_past_the_mirror_bytes_is_read_back_from_the_journal(
    sqlite_store: SqliteStore, down: FlakyStore, tmp_path: Path, monkeypatch
) -> None:
    """The journal's tail is kept in memory only up to a size in bytes (records carrying
    captured texts are large); past it, batches come from the files, decoded again."""
    monkeypatch.setattr(backlog, "MIRROR_BYTES", 8 * len(msgspec.json.encode(make(0))))
    reads = []
    load = backlog.JournalBacklog.load
    monkeypatch.setattr(
        backlog.JournalBacklog, "load", lambda self, *a: reads.append(1) or load(self, *a)
    )

    async def main() -> None:
        writer = RecordWriter(down, batch_size=5, journal=tmp_path / "journal", **FAST)
        await writer.start()
        for i in range(3):
            writer.submit(make(i))
        await wait_until(lambda: not writer.stats().store_ok)
        assert not reads  # three records fit in memory
        for i in range(3, 60):
            writer.submit(make(i))
        down.down.clear()
        await wait_until(lambda: writer.stats().pending == 0)
        assert reads  # the rest did not
        for i in range(60, 63):  # caught up: the tail is in memory again
            writer.submit(make(i))
        n = len(reads)
        await wait_until(lambda: writer.stats().pending == 0)
        assert len(reads) == n
        await writer.close(timeout=60)

    asyncio.run(main())
    assert ids(sqlite_store) == expected(63)


def test_ledgers_handed_over_share_the_records_transaction(
    sqlite_store: SqliteStore, tmp_path: Path
) -> None:
    """A turn's ledger, handed over while the writer waits for its record's batch, is
    written in that batch's transaction; ledgers with no record pending are written
    alone; through an outage they wait and are written once the store is back."""
    from prefixgate.ledger.causes import Ledger

    flaky = FlakyStore(sqlite_store)
    settled: list[tuple[int, int]] = []

    def ledger(i: int) -> Ledger:
        return Ledger(
            request_id=f"req-{i:06d}", received_at=1.0, source="model", prompt_tokens=10,
            block_size=16, cold=10,
        )  # fmt: skip

    async def main() -> None:
        writer = RecordWriter(
            flaky, journal=tmp_path / "journal", flush_interval=3600.0, retry_interval=0.02
        )
        await writer.start()
        writer.submit(make(0))
        assert writer.take_ledgers([ledger(0)], lambda w, lost: settled.append((w, lost)))
        writer.submit(make(1))
        writer.submit(make(2))
        for _ in range(10):
            await asyncio.sleep(0.001)
        assert flaky.batches == []  # the batch waits for its interval
        writer._wake.set()
        writer.batch_size = 3  # a full batch goes at once
        writer.submit(make(3))
        await wait_until(lambda: writer.stats().pending == 1)
        assert flaky.batches == [(expected(3), expected(1))]
        flaky.down.set()
        writer.take_ledgers([ledger(1), ledger(2)], lambda w, lost: settled.append((w, lost)))
        writer._wake.set()  # the next batch tried while the store is down
        await wait_until(lambda: not writer.stats().store_ok)
        assert writer.ledgers_pending == 2
        flaky.down.clear()
        # woken until it has written them (a wake within the retry interval is passed)
        await wait_until(lambda: writer._wake.set() or writer.ledgers_pending == 0)
        await writer.close()

    asyncio.run(main())
    assert flaky.batches[-1] == (["req-000003"], ["req-000001", "req-000002"])
    assert settled == [(1, 0), (2, 0)]
    assert [sqlite_store.get_ledger(f"req-{i:06d}") is not None for i in range(3)] == [True] * 3
    assert ids(sqlite_store) == expected(4)
