"""The doctor at scale: the whole diagnosis over 1M records, in SQLite and in Postgres.

Writes ``--records`` synthetic records (default 1,000,000; 30 days, two channels, four
clients in sessions of twelve) through the store's own writer into a fresh SQLite file
and a fresh Postgres database, then times ``diagnose()`` — what ``prefixgate doctor``
runs — on each. The records carry what the doctor reads: Claude Code's requests pinned at
a cached constant and, in its sessions, a clock in the system prompt that the capture
found changing (the breakers' columns), failures (5xx, and context overflows with their
reasons), and segment lists on the most recent requests of every client (the replay's
sample). Goal: at most 10 s per backend, on an ordinary machine. The Postgres table is
analysed after the fill (what autovacuum does to a table that grew), so that the planner
knows its size.

    .venv/bin/python benchmarks/doctor_scale.py [--records N] [--backends sqlite,postgres]
        [--pg postgresql://postgres@127.0.0.1:5432/postgres] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import secrets
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from prefixgate.doctor import breakers, diagnose, slices
from prefixgate.record.record import Change, Record, Segment
from prefixgate.record.shape import Shape
from prefixgate.store import open_store

DAY = 86400.0
START = 1786924800.0 - 30 * DAY
SESSION = 12
SEGMENTED = 3000  # most recent requests of each client that carry segment lists
CLIENTS = [
    # (endpoint, client, session_kind, requested_model, weight)
    ("messages", "claude-cli", "claude-code", "llm-prime", 0.35),
    ("chat", "reasonix", "openai-user", "deepseek-v4-flash-0731", 0.35),
    ("chat", "opencode", "openai-user", "deepseek-v4-flash-0731", 0.2),
    ("chat", "openai-python", None, "qwen3.8-27b", 0.1),
]
KEYS = [(f"key-{i}", f"owner-{i % 7}") for i in range(40)]
CLOCK = Change(
    scope="session",
    cls="time_of_day",
    segment="system[2]",
    upstream="messages[0]:system",
    kind="system",
    at_tokens=18_100,
    lost_tokens=40_000,
    prompt_estimate=90_000,
    shape=Shape(
        cls="time_of_day",
        char_offset=202,
        token_offset=50,
        line=4,
        paragraph=2,
        old_chars=8,
        new_chars=8,
        old_skeleton="99:99:99",
        new_skeleton="99:99:99",
        text_chars=6000,
    ),
)


def _h(*parts: object) -> str:
    return f"{hash(parts) & (2**64 - 1):016x}{len(parts):016x}"


def _segments(client: str, session: int, turn: int) -> list[Segment]:
    """A session's prompt as segments: tools, system blocks, a growing history; Claude
    Code's system block 2 new on every request (the clock)."""
    tools = Segment("tools", "tools", _h("tools", client), 72_000, 18_000)
    system = [Segment("system", "system[0]", _h("sys0", client), 400, 100)]
    clock = _h("clock", session, turn) if client == "claude-cli" else _h("sys2", client)
    system.append(Segment("system", "system[2]", clock, 6_000, 1_500))
    history = [
        Segment("message", f"messages[{i}]:{'user' if i % 2 == 0 else 'assistant'}",
                _h("m", session, i), 8_000, 2_000)
        for i in range(2 * turn + 1)
    ]  # fmt: skip
    return [tools, *system, *history]


def synth(n: int, seed: int = 0):
    rng = random.Random(seed)
    weights = [c[-1] for c in CLIENTS]
    counts: dict[str, int] = {}
    for i in range(n):
        endpoint, client, kind, model, _ = rng.choices(CLIENTS, weights)[0]
        k = counts[client] = counts.get(client, 0) + 1
        session, turn = divmod(k, SESSION)
        channel, upstream = (
            ("sglang-a6000", "qwen3.8-27b")
            if model == "qwen3.8-27b"
            else ("h200-vllm", "deepseek-v4-flash-0731")
        )
        prompt = 20_000 + 8_000 * turn + rng.randint(0, 4000)
        if client == "claude-cli":
            cached = 17920 if rng.random() < 0.85 else rng.choice((0, 256))
        else:
            cached = 0 if rng.random() < 0.1 else int(prompt * rng.uniform(0.7, 0.99)) // 64 * 64
        key, owner = KEYS[rng.randrange(len(KEYS))]
        status, etype, reason = 200, None, None
        r = rng.random()
        if r < 0.01:
            status, etype, reason = 500, "api_error", "upstream error (500): engine crashed"
        elif client == "claude-cli" and r < 0.04:
            status, etype = 400, "invalid_request_error"
            reason = f"prompt is too long: {131073 + rng.randint(0, 60000)} tokens > 131072 maximum"
        at = START + i * (30 * DAY / n)
        rec = Record(
            request_id=f"r{i}",
            received_at=at,
            endpoint=endpoint,
            client=client,
            client_version="2.1.332" if client == "claude-cli" else "1.0",
            session_kind=kind,
            session_id=f"{client}-{session}",
            key_name=key,
            key_owner=owner,
            requested_model=model,
            upstream_model=upstream,
            channel=channel,
            status=status,
            error_type=etype,
            error_message=reason,
            prompt_tokens=prompt if status == 200 else None,
            cached_tokens=cached if status == 200 else None,
            completion_tokens=rng.randint(50, 2000) if status == 200 else None,
            compared="session" if turn else None,
        )
        if turn and client == "claude-cli" and rng.random() < 0.9:
            rec.change = CLOCK
        if i >= n - SEGMENTED * len(CLIENTS):
            rec.segments_in = rec.segments_out = _segments(client, session, turn)
        yield rec


def fill(dsn: str, n: int, batch: int = 20_000) -> float:
    t0 = time.perf_counter()
    with open_store(dsn) as store:
        store.migrate()
        buf: list[Record] = []
        for rec in synth(n):
            buf.append(rec)
            if len(buf) >= batch:
                store.write_batch(buf)
                buf = []
        if buf:
            store.write_batch(buf)
    return time.perf_counter() - t0


class ServerCPU:
    """The CPU seconds the Postgres server spends for one database (its backends and
    parallel workers, read from ``/proc`` while they live: the server runs on this machine),
    sampled every 50 ms from a thread; None where ``/proc`` does not show them."""

    def __init__(self, admin: str, database: str) -> None:
        self.admin, self.database = admin, database
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self.visible = True

    def _poll(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        with psycopg.connect(self.admin, autocommit=True) as conn:
            while not self._stop.is_set():
                pids = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.database,)
                ).fetchall()
                for (pid,) in pids:
                    try:
                        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    except OSError:
                        self.visible = False
                        continue
                    self.seen[pid] = (int(fields[11]) + int(fields[12])) / tick
                self._stop.wait(0.05)

    def __enter__(self) -> ServerCPU:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def seconds(self) -> float | None:
        return round(sum(self.seen.values()), 2) if self.visible else None


def analyse(dsn: str, runs: int = 2, server: tuple[str, str] | None = None) -> dict:
    """The whole diagnosis, timed (the best of ``runs``: wall time, and this process's CPU
    time, which on a busy machine says what the doctor itself costs; for SQLite that is
    the database's work too; for Postgres the server's CPU for the database is added,
    ``server``: (admin DSN, database)); and its largest aggregation alone."""
    with open_store(dsn) as store:
        t0 = time.perf_counter()
        cells = slices.load_cells(store, None, None)
        group_by = time.perf_counter() - t0
        t1 = time.perf_counter()
        found = breakers.load(store, cells=cells)
        breakers_s = time.perf_counter() - t1
    walls, cpus, servers = [], [], []
    for _ in range(runs):
        meter = ServerCPU(*server) if server else contextlib.nullcontext()
        with meter:
            w, c = time.perf_counter(), time.process_time()
            d = diagnose(dsn)
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
        if server:
            servers.append(meter.seconds)
    return {
        "diagnose_s": round(min(walls), 2),
        "diagnose_cpu_s": round(min(cpus), 2),
        "server_cpu_s": min(servers) if servers and None not in servers else None,
        "load_average": round(os.getloadavg()[0], 1),
        "slice_group_by_s": round(group_by, 2),
        "breakers_s": round(breakers_s, 2),
        "cells": len(cells),
        "breakers": len(found),
        "findings": [f"[{f.severity}] {f.kind}: {f.title[:110]}" for f in d.findings],
    }


def _postgres(admin: str) -> tuple[str, str]:
    name = f"prefixgate_scale_{secrets.token_hex(4)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = admin.rpartition("/")
    return name, f"{base}/{name}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = {}
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory(prefix="doctor-scale-") as tmp:
            if backend == "sqlite":
                name, dsn = None, f"sqlite:///{Path(tmp) / 'records.db'}"
            else:
                name, dsn = _postgres(args.pg)
            try:
                print(f"{backend}: writing {args.records:,} records", file=sys.stderr, flush=True)
                fill_s = fill(dsn, args.records)
                print(
                    f"{backend}: written in {fill_s:.0f} s; diagnosing", file=sys.stderr, flush=True
                )
                if name is not None:
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        conn.execute("ANALYZE requests")
                server = (args.pg, name) if name is not None else None
                results[backend] = {"fill_s": round(fill_s, 1), **analyse(dsn, server=server)}
            finally:
                if name is not None:
                    with psycopg.connect(args.pg, autocommit=True) as conn:
                        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not args.json:
            r = results[backend]
            print(
                f"{backend}: {args.records:,} records (filled in {r['fill_s']:.0f} s); "
                f"diagnose {r['diagnose_s']:.2f} s (goal ≤ 10 s; this process's CPU "
                f"{r['diagnose_cpu_s']:.2f} s, the server's {r['server_cpu_s']} s, load "
                f"average {r['load_average']}): slice GROUP BY {r['slice_group_by_s']:.2f} s, "
                f"breakers on its cells {r['breakers_s']:.2f} s",
                flush=True,
            )
            for line in r["findings"]:
                print(f"  {line}")
    if args.json:
        meta = {
            "records": args.records,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        }
        print(json.dumps({**meta, "goal_s": 10.0, "backends": results}, indent=2))


if __name__ == "__main__":
    main()
