"""The store suite, run on both backends (see conftest.py): schema migrations, a round
trip of every field, content addressing, idempotent writes, paging, retention."""

from __future__ import annotations

import sqlite3

import msgspec
import psycopg
import pytest

from prefixgate.record.journal import Position
from prefixgate.record.record import Change, Record, Segment
from prefixgate.record.shape import Shape
from prefixgate.store import Store, StoreDataError, StoreError, open_store, schema, sql
from prefixgate.store.postgres import PostgresStore
from prefixgate.store.sqlite import SqliteStore
from tests.conftest import pg_schema_dsn

T0 = 1_700_000_000.0


def seg(kind: str, name: str, n: int) -> Segment:
    return Segment(kind, name, f"{n:032x}", 40 * n + 1, 10 * n + 1)


def full_record(i: int, **over) -> Record:
    seg_in = [
        seg("system", "system[0]", 1),
        seg("tools", "tools", 2),
        seg("message", "messages[0]:user", 3 + i),
    ]
    seg_out = [seg("system", "system[0]", 100), *seg_in[1:]]
    fields = dict(
        request_id=f"req-{i}",
        received_at=T0 + i + 0.123456,
        first_byte_at=T0 + i + 0.5,
        done_at=T0 + i + 1.75,
        key_name="team-a",
        key_owner="alice",
        endpoint="messages",
        client="claude-cli",
        client_version="2.1.332",
        session_id="sess-1",
        session_kind="claude-code",
        requested_model="claude-sonnet-4-5",
        upstream_model="qwen3-coder",
        channel="vllm-a",
        replica="10.0.0.7:8000",
        stream=True,
        status=200,
        error_type="overloaded_error",
        prompt_tokens=30_123,
        cached_tokens=17_920,
        completion_tokens=321,
        reported_input_tokens=12_203,
        reported_cache_read_tokens=17_920,
        reported_output_tokens=321,
        latency_ms=1534.25,
        ttft_ms=212.5,
        retries=2,
        error_message="upstream unavailable (503): engine busy",
        compared="session",
        change=Change(
            scope="session",
            cls="time_of_day",
            segment="system[1]",
            upstream="messages[0]:system",
            kind="system",
            at_tokens=18_157,
            lost_tokens=9_000 + i,
            prompt_estimate=30_000,
            shape=Shape(
                cls="time_of_day",
                char_offset=202,
                token_offset=50,
                paragraph=2,
                line=4,
                old_chars=8,
                new_chars=8,
                old_skeleton="99:99:99",
                new_skeleton="99:99:99",
                text_chars=6000,
            ),
        ),
        cache_creation_tokens=512 + i,
        cost_nano=123_456_789 + i,
        cost_saved_nano=98_765 + i,
        segments_in=seg_in,
        segments_out=seg_out,
    )
    fields.update(over)
    if "texts" not in over:
        segs = (fields["segments_in"] or []) + (fields["segments_out"] or [])
        fields["texts"] = {s.hash: f"text of {s.name} ✓" for s in segs}
    return Record(**fields)


def raw_scalar(dsn: str, query: str):
    """Run a query on the store's database behind its back."""
    if dsn.startswith("sqlite:///"):
        with sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn:
            return conn.execute(query).fetchone()[0]
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchone()[0]


def test_migrate_from_scratch_is_idempotent(store: Store, dsn: str) -> None:
    assert store.schema_version() == 0
    assert store.migrate() == schema.LATEST_VERSION
    assert store.migrate() == schema.LATEST_VERSION
    assert store.schema_version() == schema.LATEST_VERSION
    assert raw_scalar(dsn, "SELECT COUNT(*) FROM schema_version") == schema.LATEST_VERSION
    assert store.count() == 0


def _write_v1(store, record: Record) -> None:
    """A record as a version-1 gateway wrote it: only the columns migration 1 made."""
    n = len(schema.SCALAR_COLUMNS) + len(schema.SEGMENT_COLUMNS)
    kinds = dict(schema.SCALAR_COLUMNS + schema.SEGMENT_COLUMNS)
    pairs = [
        (c, v)
        for c, v in zip(schema.COLUMNS[:n], schema.record_row(record)[:n], strict=True)
        if c not in schema._ADDED_LATER
    ]
    marks = ", ".join(store._param(kinds[c]) for c, _ in pairs)
    with store._transaction(exclusive=True) as cur:
        cur.execute(
            f"INSERT INTO requests ({', '.join(c for c, _ in pairs)}) VALUES ({marks})",
            [v for _, v in pairs],
        )


def test_migrate_from_version_1_keeps_data(store: Store, dsn: str) -> None:
    assert store.migrate(target=1) == 1
    _write_v1(store, full_record(0))
    assert store.migrate() == schema.LATEST_VERSION
    assert store.migrate() == schema.LATEST_VERSION
    [back] = store.iter_records()
    assert back.request_id == "req-0" and back.change is None and back.error_message is None
    assert back.cost_nano is None
    assert back.route_source is None
    store.write_batch([full_record(1, route_source="events")])
    assert [r.route_source for r in store.iter_records()] == [None, "events"]
    # a second process opening the migrated database finds nothing to do
    with open_store(dsn) as other:
        assert other.migrate() == schema.LATEST_VERSION
        assert other.count() == 2


def test_migrate_refuses_unknown_target(store: Store) -> None:
    with pytest.raises(ValueError):
        store.migrate(target=schema.LATEST_VERSION + 1)


def test_round_trip_of_every_field(store: Store) -> None:
    store.migrate()
    records = [
        full_record(0),
        # out == in: stored once, read back equal
        full_record(1, segments_out=full_record(1).segments_in),
        # the defaults: None everywhere, no segments, no texts
        Record(request_id="req-2", received_at=T0 + 2),
        # segments but no capture; an empty list is not None
        full_record(3, texts=None, segments_out=[], stream=False, status=502),
    ]
    store.write_batch(records)
    assert store.count() == 4
    back = list(store.iter_records(with_texts=True))
    assert back == records
    assert type(back[0].stream) is bool
    assert type(back[0].segments_in[0]) is Segment
    # without with_texts, texts stay None
    assert [r.texts for r in store.iter_records()] == [None] * 4


def test_texts_are_content_addressed(store: Store, dsn: str) -> None:
    store.migrate()
    a, b = full_record(0), full_record(1)
    shared = set(a.texts) & set(b.texts)
    assert shared
    store.write_batch([a])
    store.write_batch([b])
    distinct = set(a.texts) | set(b.texts)
    assert raw_scalar(dsn, "SELECT COUNT(*) FROM segment_texts") == len(distinct)
    texts = store.get_texts([*distinct, "f" * 32])
    assert texts == {**a.texts, **b.texts}


def test_writes_are_idempotent_per_request_id(store: Store) -> None:
    store.migrate()
    batch = [full_record(i) for i in range(5)]
    store.write_batch(batch)
    store.write_batch(batch[2:] + [full_record(5)])
    assert store.count() == 6
    assert sorted(r.request_id for r in store.iter_records()) == [f"req-{i}" for i in range(6)]


def test_iter_records_window_and_pages(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sql, "PAGE_SIZE", 7)
    store.migrate()
    # ties in received_at across page boundaries
    records = [Record(request_id=f"r{i:03d}", received_at=T0 + i // 3) for i in range(40)]
    store.write_batch(records[::-1])
    got = list(store.iter_records())
    assert sorted(r.request_id for r in got) == [r.request_id for r in records]
    assert [r.received_at for r in got] == sorted(r.received_at for r in records)
    window = list(store.iter_records(since=T0 + 2, until=T0 + 5))
    assert {r.request_id for r in window} == {f"r{i:03d}" for i in range(6, 15)}


def test_prune_deletes_old_records_and_their_texts(store: Store, dsn: str) -> None:
    store.migrate()
    day = 86_400.0
    old = full_record(0, received_at=T0 - 30 * day)
    new = full_record(1, received_at=T0)
    store.write_batch([old, new])
    deleted = store.prune(7 * day, now=T0 + 60)
    assert deleted == 1
    assert store.count() == 1
    assert [r.request_id for r in store.iter_records()] == ["req-1"]
    # texts only the old record carried are gone; shared ones stay
    left = store.get_texts(list(old.texts) + list(new.texts))
    assert set(left) == set(new.texts)
    assert store.prune(7 * day, now=T0 + 60) == 0


def test_prune_keeps_texts_still_referenced(store: Store) -> None:
    store.migrate()
    day = 86_400.0
    old = full_record(0, received_at=T0 - 30 * day)
    store.write_batch([old])
    # the same texts seen again recently, by a record written in a later batch
    new = full_record(0, request_id="again", received_at=T0)
    store.write_batch([new])
    store.prune(7 * day, now=T0)
    assert set(store.get_texts(new.texts)) == set(new.texts)


def test_count(store: Store) -> None:
    store.migrate()
    for k in range(3):
        store.write_batch([full_record(10 * k + i) for i in range(k + 1)])
    assert store.count() == 6


def test_closed_store_raises_store_error(dsn: str) -> None:
    s = open_store(dsn)
    s.migrate()
    s.close()
    with pytest.raises(StoreError):
        s.count()


def test_open_store_dsns(tmp_path) -> None:
    path = tmp_path / "a.db"
    for dsn in (f"sqlite:///{path}", str(path)):
        with open_store(dsn) as s:
            assert isinstance(s, SqliteStore) and s.path == str(path)
    with open_store("sqlite://:memory:") as s:
        assert s.migrate() == schema.LATEST_VERSION
        s.write_batch([full_record(0)])
        assert s.count() == 1
    assert isinstance(open_store("postgresql://u:pw@127.0.0.1:1/x"), PostgresStore)
    for bad in ("mysql://x", "records.txt", "sqlite:relative.db"):
        with pytest.raises(StoreError):
            open_store(bad)


def test_sqlite_uses_wal(tmp_path) -> None:
    path = tmp_path / "w.db"
    with SqliteStore(path) as s:
        s.migrate()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_unreachable_postgres_is_a_store_error_without_secrets() -> None:
    s = open_store("postgresql://postgres:hunter2secret@127.0.0.1:1/nowhere")
    assert "hunter2secret" not in repr(s)
    with pytest.raises(StoreError) as info:
        s.migrate()
    assert "hunter2secret" not in str(info.value)
    s.close()


def test_a_locked_table_fails_the_write_after_the_lock_timeout(dsn: str) -> None:
    """A stalled store is a failed store: another session holds the requests table (or
    the SQLite write lock) and the write fails with a StoreError instead of waiting."""
    with open_store(dsn) as s:
        s.migrate()
    with open_store(dsn, statement_timeout=30, lock_timeout=0.2) as s:
        if dsn.startswith("sqlite:///"):
            holder = sqlite3.connect(dsn.removeprefix("sqlite:///"), isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")
        else:
            holder = psycopg.connect(dsn)
            holder.execute("LOCK TABLE requests IN ACCESS EXCLUSIVE MODE")
        try:
            with pytest.raises(StoreError, match="lock|locked"):
                s.write_batch([full_record(1)])
        finally:
            holder.rollback()
            holder.close()
        s.write_batch([full_record(1)])  # the same store works once the lock is gone
        assert s.count() == 1


@pytest.mark.postgres
def test_a_slow_postgres_statement_fails_after_the_statement_timeout(pg_database: str) -> None:
    with open_store(pg_schema_dsn(pg_database), statement_timeout=0.2) as s:
        with pytest.raises(StoreError, match="statement timeout"):
            s.query("SELECT pg_sleep(30)")
        assert s.query("SHOW statement_timeout") == [("200ms",)]


def test_a_value_the_store_cannot_hold_is_a_data_error(store: Store, dsn: str) -> None:
    """Bad data is told apart from a failing store: retrying would fail the same way."""
    store.migrate()
    bad = (
        full_record(1, requested_model="a\x00b")
        if dsn.startswith("postgres")
        else full_record(1, prompt_tokens=1 << 70)
    )
    with pytest.raises(StoreDataError):
        store.write_batch([bad])
    store.write_batch([full_record(2)])
    assert store.count() == 1


def _old_row(record: Record) -> tuple:
    """A record's row as the store made it before its segments came encoded from the
    journal: each list encoded to text here, compared as lists."""
    row = list(schema.record_row(record))
    n = len(schema.SCALAR_COLUMNS)
    same = record.segments_out is not None and record.segments_out == record.segments_in
    row[n] = schema.encode_segments(record.segments_in)
    row[n + 1] = None if same else schema.encode_segments(record.segments_out)
    row[n + 2] = same
    return tuple(row)


def _variants() -> list[Record]:
    """Segment lists in every relation: different, equal (one list, or two), absent,
    empty, one side only; texts that are not ASCII."""
    base = full_record(0, texts={"a": "é ✓"})
    equal = [seg("system", "système[0]", 1), seg("message", "messages[0]:user", 2)]
    return [
        base,
        msgspec.structs.replace(base, segments_out=base.segments_in),
        msgspec.structs.replace(base, segments_in=equal, segments_out=list(equal)),
        msgspec.structs.replace(base, segments_in=None, segments_out=None),
        msgspec.structs.replace(base, segments_in=[], segments_out=[]),
        msgspec.structs.replace(base, segments_in=None),
        msgspec.structs.replace(base, segments_out=None),
        msgspec.structs.replace(base, change=None, diagnosis=None),
    ]


def test_rows_from_the_journals_encoding_are_those_written_before(
    store: Store, dsn: str, tmp_path
) -> None:
    """Rows written with the segments the journal encoded (spliced into its line as is)
    hold what rows encoded here held, stored as the same types, and read back equal."""
    from prefixgate.record.journal import Journal

    store.migrate()
    journal = Journal(tmp_path / "journal")
    journal.open()
    variants = _variants()
    old, new, encoded = [], [], []
    for i, record in enumerate(variants):
        line_before = msgspec.json.encode(record)
        assert journal.append(record) is not None
        assert journal.last_segments is not None
        encoded.append(journal.last_segments)
        new.append(msgspec.structs.replace(record, request_id=f"new-{i}"))
        old.append(msgspec.structs.replace(record, request_id=f"old-{i}"))
        assert journal.read(Position(1, 0), dict(journal.sizes), 100)[0][-1] == record
        assert msgspec.json.encode(record) == line_before  # the record is left as it was
    end = journal.end
    with open(journal.slot / f"{end.seq:012d}.jsonl", "rb") as f:  # type: ignore[operator]
        lines = f.read().splitlines()
    assert lines == [msgspec.json.encode(r) for r in variants]  # the same bytes as before
    journal.close(everything_stored=True)

    store.write_batch(new, segments=encoded)
    assert isinstance(store, sql.SqlStore)
    with store._transaction(exclusive=True) as cur:
        cur.executemany(store._insert_request, [_old_row(r) for r in old])
    types = (
        "typeof(segments_in), typeof(segments_out), typeof(change), typeof(diagnosis)"
        if dsn.startswith("sqlite")
        else "pg_typeof(segments_in)::text, pg_typeof(segments_out)::text,"
        " pg_typeof(change)::text, pg_typeof(diagnosis)::text"
    )
    cols = ", ".join(c for c in store._select_cols.split(", ") if c != "request_id")
    for i, record in enumerate(variants):
        got = [
            store.query(f"SELECT {cols}, {types} FROM requests WHERE request_id = ?", [rid])
            for rid in (f"old-{i}", f"new-{i}")
        ]
        assert got[0] == got[1] and len(got[0]) == 1
        back_new, back_old = store.get_record(f"new-{i}"), store.get_record(f"old-{i}")
        assert back_new is not None and back_old is not None
        assert msgspec.structs.replace(back_new, request_id="") == msgspec.structs.replace(
            back_old, request_id=""
        )
        assert back_new.segments_in == record.segments_in
        assert back_new.segments_out == record.segments_out


def test_ledgers_written_in_the_records_transaction(store: Store) -> None:
    """``write_batch``'s ledgers are stored as ``write_ledgers`` stores them, with records
    or alone, once per request."""
    from prefixgate.ledger.causes import Ledger

    store.migrate()
    ledgers = [
        Ledger(
            request_id=f"req-{i}",
            received_at=T0 + i,
            source="model",
            prompt_tokens=100,
            block_size=16,
            hit=96,
            cold=4,
            engine_cached=96,
            changed_segment="messages[3]:user",
        )  # fmt: skip
        for i in range(3)
    ]
    store.write_batch([full_record(0)], ledgers=ledgers[:2])
    store.write_batch([], ledgers=ledgers[1:])
    assert store.count() == 1
    assert [store.get_ledger(f"req-{i}") for i in range(3)] == ledgers
