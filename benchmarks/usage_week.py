"""A week of demo traffic, priced: the worked example of docs/usage.md.

    python benchmarks/usage_week.py [--sessions 4] [--turns 20] [--out DIR] [--json]

Seven "days" of the demo's traffic (``prefixgate demo``: half Claude-Code-like sessions,
half stable-prefix agents, a different seed each day) go through the gateway into one
SQLite store, with a price table: days 1-3 with the billing-header protection off (the
incident), days 4-7 with it on (the fix). Each day runs in a minute or so; its records are
then moved back to their day of the week (their timestamps shifted by whole days, nothing
else changed), so ``prefixgate usage --by day`` sees a week.

It prints the usage report by day and by client (the same as ``prefixgate usage --config
DIR/prices.json --store sqlite:///DIR/week.db --since all --by day``), and what the fix
saves: the mean cost of a day with the header kept less that of a day with it stripped
(the days carry the same traffic, seeds apart), over a week, beside what the report said
the misses with a known cause lost on the incident's days.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from prefixgate.config import parse_config
from prefixgate.lab.incident import MODEL, _spec, run_phase
from prefixgate.lab.traffic import generate
from prefixgate.spend.prices import PriceTable, fmt_money
from prefixgate.spend.usage_report import render_json, render_text, usage_report
from prefixgate.store import open_store

DAY = 86400
FIXED_FROM = 3  # days 0-2: the incident, 3-6: the fix
# Per million tokens; Claude-Sonnet-like list prices (fresh, cached, written, output).
PRICES = {
    "currency": "USD",
    "models": {MODEL: {"input": 3.0, "cached_input": 0.3, "cache_write": 3.75, "output": 15.0}},
}


@contextlib.contextmanager
def ticker(name: str, total: int):
    done = [0]

    def tick() -> None:
        done[0] += 1
        if done[0] % 50 == 0 or done[0] == total:
            print(f"  {name}: {done[0]}/{total}", file=sys.stderr, flush=True)

    yield tick


def week(out: Path, sessions: int, turns: int, seed: int) -> tuple[str, float]:
    """Seven days of traffic into ``out/week.db``; the start of the week (epoch)."""
    db = out / "week.db"
    for suffix in ("", "-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    dsn = f"sqlite:///{db}"
    today = time.time() // DAY * DAY
    for day in range(7):
        strip = day >= FIXED_FROM
        name = f"day {day + 1} ({'header stripped' if strip else 'header kept'})"
        traffic = generate(_spec(sessions, turns, seed + day))
        total = sum(len(s) for s in traffic)
        print(f"{name}: {total} requests", file=sys.stderr, flush=True)
        t0 = time.time()
        with ticker(name, total) as tick:
            store = {"dsn": dsn, "journal_path": None}  # written at once: moved below
            run_phase(name, strip, dsn, traffic, 6, tick, extra={"prices": PRICES, "store": store})
        # Move what this day recorded back to its day of the week (the last day is today).
        back = (6 - day) * DAY
        with sqlite3.connect(db) as conn:
            conn.execute(
                "UPDATE requests SET received_at = received_at - ?,"
                " first_byte_at = first_byte_at - ?, done_at = done_at - ?"
                " WHERE received_at >= ?",
                (back, back, back, t0),
            )
    return dsn, today - 6 * DAY


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=4, help="sessions a day")
    ap.add_argument("--turns", type=int, default=20, help="turns a session")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, help="where the store and prices.json go")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="prefixgate-week-"))
    out.mkdir(parents=True, exist_ok=True)
    dsn, start = week(out, args.sessions, args.turns, args.seed)
    config = {
        "channels": [{"name": "h200-vllm", "base_url": "http://127.0.0.1:9/v1"}],
        "prices": PRICES,
        "store": {"dsn": dsn},
    }
    (out / "prices.json").write_text(json.dumps(config))
    prices = PriceTable.from_config(parse_config(config).prices)
    with open_store(dsn) as store:
        by_day = usage_report(store, "day", prices=prices)
        by_client = usage_report(store, "client", prices=prices)
    days = by_day.rows
    kept = [r.cost_nano or 0 for r in days[:FIXED_FROM]]
    fixed = [r.cost_nano or 0 for r in days[FIXED_FROM:]]
    kept_day, fixed_day = sum(kept) / len(kept), sum(fixed) / len(fixed)
    lost_day = sum(r.lost_nano or 0 for r in days[:FIXED_FROM]) / FIXED_FROM
    result = {
        "store": dsn,
        "days": len(days),
        "cost_per_day_header_kept": round(kept_day / 1e9, 4),
        "cost_per_day_header_stripped": round(fixed_day / 1e9, 4),
        "fix_saves_per_week": round((kept_day - fixed_day) * 7 / 1e9, 4),
        "fix_saves_share": round(1 - fixed_day / kept_day, 4) if kept_day else None,
        "lost_per_day_header_kept": round(lost_day / 1e9, 4),
        "by_day": json.loads(render_json(by_day)),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(render_text(by_day))
    print()
    print(render_text(by_client))
    print(
        f"\nA day with the header kept cost {fmt_money(int(kept_day), 4)} USD, with it stripped "
        f"{fmt_money(int(fixed_day), 4)} USD: the fix saves "
        f"{fmt_money(int((kept_day - fixed_day) * 7), 4)} USD a week "
        f"({result['fix_saves_share']:.0%}); the report priced what misses with a known "
        f"cause lost at {fmt_money(int(lost_day), 4)} USD a day on the incident's days."
    )
    print(f"\nstore: {dsn}  (prefixgate usage --config {out}/prices.json --since all --by day)")


if __name__ == "__main__":
    main()
