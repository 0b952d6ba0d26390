"""Record writer throughput: records/s from submit() to durable in the store.

Each record looks like a Claude Code turn: all scalar fields set and 20 segments in and
out (out differs from in at system[0], as after billing-header hygiene), no texts.
SQLite goes to a temporary file; Postgres to a temporary database on --pg (dropped after).

    python benchmarks/record_writer.py [--records 50000] [--pg postgresql://postgres@127.0.0.1:5432/postgres] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from prefixgate.record.record import Record, Segment
from prefixgate.record.writer import RecordWriter
from prefixgate.store.postgres import PostgresStore
from prefixgate.store.sqlite import SqliteStore


def make_records(n: int) -> list[Record]:
    base = [
        Segment("system", f"system[{i}]", secrets.token_hex(16), 500 + i, 125) for i in range(3)
    ] + [
        Segment("message", f"messages[{i}]:user", secrets.token_hex(16), 900, 225)
        for i in range(17)
    ]
    out = [Segment("system", "system[0]", secrets.token_hex(16), 80, 20), *base[1:]]
    now = time.time()
    return [
        Record(
            request_id=f"req-{i:08d}-{secrets.token_hex(4)}",
            received_at=now + i * 1e-4,
            first_byte_at=now + i * 1e-4 + 0.2,
            done_at=now + i * 1e-4 + 1.5,
            key_name="team-a",
            key_owner="alice",
            endpoint="messages",
            client="claude-cli",
            client_version="2.1.332",
            session_id=f"session-{i % 50}",
            session_kind="claude-code",
            requested_model="claude-sonnet",
            upstream_model="qwen3-coder",
            channel="vllm-a",
            replica="r1",
            stream=True,
            status=200,
            prompt_tokens=30_000 + i % 1000,
            cached_tokens=29_000,
            completion_tokens=300,
            reported_input_tokens=1000,
            reported_cache_read_tokens=29_000,
            reported_output_tokens=300,
            latency_ms=1500.0,
            ttft_ms=200.0,
            segments_in=base,
            segments_out=out,
        )
        for i in range(n)
    ]


async def run_writer(store_factory, records: list[Record], journal: Path) -> dict:
    writer = RecordWriter(store_factory, journal=journal)
    await writer.start()
    t0 = time.perf_counter()
    for i, record in enumerate(records):
        writer.submit(record)
        if i % 1000 == 999:
            await asyncio.sleep(0)  # let the loop breathe, as a server would
    await writer.close(timeout=600)
    elapsed = time.perf_counter() - t0
    stats = writer.stats()
    return {
        "records": len(records),
        "seconds": elapsed,
        "records_per_s": len(records) / elapsed,
        "written": stats.written,
        "left_in_journal": stats.pending,
        "dropped": stats.dropped,
    }


def bench_sqlite(records: list[Record]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        result = asyncio.run(run_writer(lambda: SqliteStore(path), records, Path(tmp) / "journal"))
        with SqliteStore(path) as store:
            result["stored"] = store.count()
    return result


def bench_postgres(records: list[Record], admin_dsn: str) -> dict:
    name = f"prefixgate_bench_{secrets.token_hex(4)}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            result = asyncio.run(
                run_writer(lambda: PostgresStore(dsn), records, Path(tmp) / "journal")
            )
        with PostgresStore(dsn) as store:
            result["stored"] = store.count()
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--no-pg", action="store_true", help="skip Postgres")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    records = make_records(args.records)
    results = {"sqlite": bench_sqlite(records)}
    if not args.no_pg:
        results["postgres"] = bench_postgres(records, args.pg)
    if args.json:
        print(json.dumps(results))
    else:
        for backend, r in results.items():
            print(
                f"{backend:9s} {r['records_per_s']:>10,.0f} records/s "
                f"({r['records']} in {r['seconds']:.2f} s, stored {r['stored']})"
            )
    return 0 if results["sqlite"]["records_per_s"] >= 5000 else 1


if __name__ == "__main__":
    sys.exit(main())
