"""The doctor at scale: slice and distribution analysis over 1M records in SQLite.

Writes ``--records`` synthetic records (default 1,000,000; 30 days, two channels, four
clients, a Messages entry with a pinned cached constant among them) into a fresh SQLite
store, then times the in-database analysis the doctor runs first: the one ``GROUP BY``
over every dimension and day, the ranking of slices, and for each weak slice its
cached-token distribution and the block-size inference. Goal: at most 10 s.

    .venv/bin/python benchmarks/doctor_scale.py [--records N] [--db PATH] [--keep] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

from prefixgate.doctor import distribution, slices
from prefixgate.record.model import Record
from prefixgate.store import open_store

DAY = 86400.0
START = 1786924800.0 - 30 * DAY
CLIENTS = [
    # (endpoint, client, session_kind, requested_model, weight)
    ("messages", "claude-cli", "claude-code", "llm-prime", 0.35),
    ("chat", "reasonix", "openai-user", "deepseek-v4-flash-0731", 0.35),
    ("chat", "opencode", "openai-user", "deepseek-v4-flash-0731", 0.2),
    ("chat", "openai-python", None, "qwen3.8-27b", 0.1),
]
KEYS = [(f"key-{i}", f"owner-{i % 7}") for i in range(40)]


def synth(n: int, seed: int = 0):
    rng = random.Random(seed)
    weights = [c[-1] for c in CLIENTS]
    for i in range(n):
        endpoint, client, kind, model, _ = rng.choices(CLIENTS, weights)[0]
        channel, upstream = (
            ("sglang-a6000", "qwen3.8-27b")
            if model == "qwen3.8-27b"
            else ("h200-vllm", "deepseek-v4-flash-0731")
        )
        prompt = rng.randint(20_000, 180_000)
        if client == "claude-cli":
            cached = 17920 if rng.random() < 0.85 else rng.choice((0, 256))
        else:
            cached = 0 if rng.random() < 0.1 else int(prompt * rng.uniform(0.7, 0.99)) // 64 * 64
        key, owner = KEYS[rng.randrange(len(KEYS))]
        yield Record(
            request_id=f"r{i}",
            received_at=START + i * (30 * DAY / n),
            endpoint=endpoint,
            client=client,
            session_kind=kind,
            session_id=f"s{i // 12}",
            key_name=key,
            key_owner=owner,
            requested_model=model,
            upstream_model=upstream,
            channel=channel,
            status=200 if rng.random() > 0.01 else 500,
            prompt_tokens=prompt,
            cached_tokens=cached,
            completion_tokens=rng.randint(50, 2000),
        )


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


def analyse(dsn: str) -> dict:
    timings: dict[str, float] = {}
    with open_store(dsn) as store:
        t0 = time.perf_counter()
        cells = slices.load_cells(store, None, None)
        timings["group_by_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        ranked = slices.rank(cells)
        weak = slices.weak(ranked, cells)
        timings["rank_s"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        found = []
        for s in weak:
            scope = s.filters() if s.dimension in slices.GLOBAL else s.filters()[:2]
            block = distribution.infer_block(distribution.cached_values(store, scope))
            d = distribution.analyse(
                distribution.load(store, s.filters()), block.block if block else None
            )
            found.append(
                {
                    "slice": s.label,
                    "hit_rate": round(s.rate.hit_rate, 4),
                    "block": block.block if block else None,
                    "pinned": d.pinned.expression if d.pinned else None,
                }
            )
        timings["distributions_s"] = time.perf_counter() - t2
        timings["total_s"] = time.perf_counter() - t0
    return {"cells": len(cells), "slices_ranked": len(ranked), "weak": found, **timings}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--db", help="SQLite file to use (reused if it exists)")
    ap.add_argument("--keep", action="store_true", help="keep the database file")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = None
    if args.db:
        path = Path(args.db)
    else:
        tmp = tempfile.mkdtemp(prefix="doctor-scale-")
        path = Path(tmp) / "records.db"
    dsn = f"sqlite:///{path}"
    fill_s = None
    if not path.exists():
        fill_s = fill(dsn, args.records)
    result = {
        "records": args.records,
        "fill_s": fill_s,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        **analyse(dsn),
        "goal_s": 10.0,
    }
    if tmp and not args.keep:
        for p in Path(tmp).iterdir():
            p.unlink()
        os.rmdir(tmp)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.records:,} records; fill {fill_s or 0:.1f} s")
        print(
            f"slice GROUP BY {result['group_by_s']:.2f} s, ranking {result['rank_s']:.2f} s, "
            f"distributions {result['distributions_s']:.2f} s: total {result['total_s']:.2f} s (goal ≤ 10 s)"
        )
        for w in result["weak"]:
            print(
                f"  weak: {w['slice']} {w['hit_rate']:.2%} block {w['block']} pinned {w['pinned']}"
            )


if __name__ == "__main__":
    main()
