"""A session's records go into the store as a difference to the session's root record
(record/roots.py) and every reader gets them back whole (store/lists.py): the store's own
reads, the doctor's and the dashboard's, after a replay of the journal, and after
retention, on SQLite and on Postgres."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from prefixgate.doctor import segments as doctor_segments
from prefixgate.record.record import Record, Segment
from prefixgate.record.writer import RecordWriter
from prefixgate.store import Store, StoreError
from prefixgate.web.queries import request_detail

FAST = {"flush_interval": 0.01, "retry_interval": 0.02}


def seg(i: int, kind: str = "message") -> Segment:
    return Segment(kind, f"messages[{i}]", f"{i:032x}", 400 + i, 100)


def session(sid: str, turns: int, t0: float = 1_700_000_000.0) -> list[Record]:
    """A growing agent session: two messages a turn, a system block the engine hoists
    (a different upstream list), a compaction at turn 20."""
    system = Segment("system", "system[0]", "e" * 32, 900, 225)
    prompt = [Segment("tools", "tools", "d" * 32, 5000, 1250), *(seg(i) for i in range(10))]
    out = []
    for n in range(turns):
        if n == 20:
            prompt = [prompt[0], seg(900), seg(901)]  # compacted: a summary
        prompt = [*prompt, seg(100 * n + 1000), seg(100 * n + 1001)]
        hoisted = n % 3 == 0
        seg_in = [*prompt, system] if hoisted else list(prompt)
        seg_out = [prompt[0], system, *prompt[1:]] if hoisted else seg_in
        out.append(
            Record(
                request_id=f"{sid}-{n:03d}",
                received_at=t0 + n,
                endpoint="messages",
                session_id=sid,
                status=200,
                prompt_tokens=100 * len(seg_in),
                segments_in=seg_in,
                segments_out=seg_out,
            )
        )
    return out


async def write(store: Store | object, records: list[Record], journal: Path) -> RecordWriter:
    writer = RecordWriter(store, journal=journal, **FAST)  # type: ignore[arg-type]
    await writer.start()
    for r in records:
        writer.submit(r)
    await writer.close(timeout=60)
    return writer


def test_a_session_is_stored_as_tails_and_read_back_whole(store: Store, tmp_path: Path) -> None:
    records = session("a", 40) + session("b", 12, t0=1_700_000_100.0)
    asyncio.run(write(store, records, tmp_path / "journal"))
    for r in records:
        got = store.get_record(r.request_id)
        assert got is not None
        assert (got.segments_in, got.segments_out) == (r.segments_in, r.segments_out)
        assert got.segments_root is None
    read = {r.request_id: r for r in store.iter_records()}
    assert [(read[r.request_id].segments_in, read[r.request_id].segments_out) for r in records] == [
        (r.segments_in, r.segments_out) for r in records
    ]
    # most rows hold only their tails: the stored JSON is a fraction of the whole lists'
    rows = store.query("SELECT segments_root, CAST(segments_in AS TEXT) FROM requests")
    assert sum(root is not None for root, _ in rows) > len(rows) // 2
    stored = sum(len(text) for _, text in rows)
    whole = sum(len(msgspec.json.encode(r.segments_in)) for r in records)
    assert stored < whole / 2
    # the doctor's reader and the dashboard's
    loaded = doctor_segments.load(store, [])
    assert [(c.request_id, c.seg_in, c.seg_out) for c in loaded] == [
        (r.request_id, r.segments_in, r.segments_out)
        for r in sorted(records, key=lambda r: r.received_at)
    ]
    detail = request_detail(store, "a-031")
    assert detail is not None
    want = records[31]
    assert [s["hash"] for s in detail["segments_in"]] == [s.hash for s in want.segments_in or []]
    assert [s["hash"] for s in detail["segments_out"]] == [s.hash for s in want.segments_out or []]
    assert detail["changed_in"] is not None and detail["changed_in"]["index"] is not None


def test_records_replayed_from_the_journal_read_back_whole(store: Store, tmp_path: Path) -> None:
    records = session("c", 30)
    journal = tmp_path / "journal"

    def down() -> Store:
        raise StoreError("the store is down (test)")

    first = asyncio.run(write(down, records, journal))
    assert first.stats().pending == len(records)  # all of it waits in the journal
    asyncio.run(write(store, [], journal))  # a new process: no roots in its memory
    for r in records:
        got = store.get_record(r.request_id)
        assert got is not None and (got.segments_in, got.segments_out) == (
            r.segments_in,
            r.segments_out,
        )


def test_retention_keeps_a_root_while_a_record_kept_builds_on_it(
    store: Store, tmp_path: Path
) -> None:
    records = session("d", 18)  # no compaction: later records build on early roots
    asyncio.run(write(store, records, tmp_path / "journal"))
    roots = {
        rid
        for (rid,) in store.query(
            "SELECT segments_root FROM requests WHERE segments_root IS NOT NULL"
        )
    }
    now = records[10].received_at + 1000
    deleted = store.prune(1000, now=now)  # everything received before turn 10
    kept = {r.request_id for r in store.iter_records()}
    assert deleted > 0
    builds = {
        root
        for (root,) in store.query(
            "SELECT segments_root FROM requests WHERE segments_root IS NOT NULL"
        )
    }
    assert builds <= kept and builds & {r.request_id for r in records[:10]}
    assert builds <= roots
    for r in records[10:]:
        got = store.get_record(r.request_id)
        assert got is not None and got.segments_in == r.segments_in
    early = {r.request_id for r in records[:10]}
    assert early & kept == early & builds  # of those before the cutoff, only roots in use
    store.prune(0, now=now + 1e6)  # everything: the roots go with the last record on them
    assert store.count() == 0
