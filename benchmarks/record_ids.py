"""What a record's id costs the store: pages written and CPU a batch, random ids against
time-ordered ones (``record.new_request_id``, a UUIDv7, given the simulated time).

    python benchmarks/record_ids.py [--records 20000] [--batches 300] [--batch 3]

A SQLite store (the project's schema, migrated) is filled with ``--records`` records and
their miss ledgers, then ``--batches`` batches of ``--batch`` records (a turn of as many
sessions, each record with its ledger, as the record writer writes them) are written
through ``write_batch``. After each batch the write-ahead log's growth is read (its
frames: the pages the batch wrote) and the log checkpointed, outside the CPU counted.
Each kind of id runs twice, alternating. The request's id is a key of two unique
indexes (``requests_request_id``, ``ledgers_request_id``): a random one lands on a
random page of each, a time-ordered one on their last.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from prefixgate.ledger.causes import Ledger  # noqa: E402
from prefixgate.record.record import Record, Segment, new_request_id  # noqa: E402
from prefixgate.store import open_store  # noqa: E402

T0 = 1_790_000_000.0
FRAME = 4096 + 24  # a WAL frame: a page and its header


def random_id() -> str:
    return os.urandom(16).hex()  # the ids before new_request_id


def record(rid: str, at: float, session: str, rng: random.Random) -> Record:
    segs = [
        Segment("message", f"messages[{i}]:user", f"{rng.getrandbits(128):032x}", 900, 225)
        for i in range(12)
    ]  # a record's tail of segments, as stored against its session's root
    return Record(
        request_id=rid,
        received_at=at,
        endpoint="messages",
        session_id=session,
        requested_model="m",
        upstream_model="m",
        channel="c",
        status=200,
        prompt_tokens=60_000,
        cached_tokens=59_000,
        segments_in=segs,
        segments_out=segs,
    )


def ledger(rid: str, at: float) -> Ledger:
    return Ledger(
        request_id=rid, received_at=at, source="model", prompt_tokens=60_000, block_size=16,
        hit=59_000, prefix_changed=1_000, changed_segment="messages[40]:user",
    )  # fmt: skip


def run(ordered: bool, args, rng: random.Random) -> tuple[float, float]:
    """(pages a batch, CPU µs a batch) for one kind of id."""
    sessions = [f"{rng.getrandbits(128):032x}" for _ in range(200)]
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "store.db"
        store = open_store(f"sqlite:///{db}")
        store.migrate()
        conn = store._conn  # the store's own connection: the log checkpointed by hand
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        at = T0
        for start in range(0, args.records, 500):  # the store as a team's after a while
            recs, leds = [], []
            for _ in range(min(500, args.records - start)):
                at += 1.0
                rid = new_request_id(int(at * 1000)) if ordered else random_id()
                recs.append(record(rid, at, rng.choice(sessions), rng))
                leds.append(ledger(rid, at))
            store.write_batch(recs, ledgers=leds)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        wal = Path(str(db) + "-wal")
        pages = cpu = 0.0
        for _ in range(args.batches):
            recs, leds = [], []
            for k in range(args.batch):
                at += 0.2
                rid = new_request_id(int(at * 1000)) if ordered else random_id()
                recs.append(record(rid, at, sessions[k], rng))
                leds.append(ledger(rid, at))
            t = time.process_time()
            store.write_batch(recs, ledgers=leds)
            cpu += time.process_time() - t
            pages += wal.stat().st_size / FRAME
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        store.close()
    return pages / args.batches, cpu / args.batches * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--batch", type=int, default=3)
    args = ap.parse_args()
    rng = random.Random(7)
    rows: dict[str, list[tuple[float, float]]] = {"random": [], "time-ordered": []}
    for _ in range(2):
        for ordered, name in ((False, "random"), (True, "time-ordered")):
            rows[name].append(run(ordered, args, rng))
    print(f"{args.records} records stored, then {args.batches} batches of {args.batch}")
    print(f"{'ids':<14}{'pages a batch':>16}{'CPU µs a batch':>18}")
    for name, runs in rows.items():
        pages = " / ".join(f"{p:.1f}" for p, _ in runs)
        cpu = " / ".join(f"{c:.0f}" for _, c in runs)
        print(f"{name:<14}{pages:>16}{cpu:>18}")


if __name__ == "__main__":
    main()
