"""Reliability: each row of docs/reliability.md's table, measured, beside its goal.

    python benchmarks/reliability.py                        # every case (about an hour)
    python benchmarks/reliability.py --case sigkill_sqlite --case host-rules
    python benchmarks/reliability.py --list | --json

The rows live in three modules, by subject: durability (``reliability_durability.py``:
SIGKILL under load, a locked store, a store down, the journal's cost), the bounded edge
(``reliability_edge.py``: slowloris, an endless header, Host rules, the connection cap,
port in use, SIGTERM, busy polling's default) and whom an error blames
(``reliability_errors.py``: an unknown model, garbage before the first byte, a dead
upstream's log, request ids). Each is a table ``CASES`` of functions of the parsed
arguments returning ``{case, result, goal, met}``, with ``add_arguments`` for its options.
Progress goes to stderr; the table (or ``--json``) to stdout; the exit status is 1 when a
case missed its goal.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reliability_durability as durability  # noqa: E402
import reliability_edge as edge  # noqa: E402
import reliability_errors as errors  # noqa: E402

MODULES = (durability, edge, errors)
CASES = {name: fn for m in MODULES for name, fn in m.CASES.items()}


def table(rows: list[dict]) -> str:
    lines = ["| case | result | goal | met |", "| --- | --- | --- | --- |"]
    lines += [
        f"| {r['case']} | {r['result']} | {r['goal']} | {'yes' if r['met'] else 'NO'} |"
        for r in rows
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", choices=list(CASES), help="run only this case")
    ap.add_argument("--list", action="store_true", help="the case names")
    ap.add_argument("--json", action="store_true")
    for m in MODULES:
        m.add_arguments(ap)
    args = ap.parse_args()
    if args.list:
        print("\n".join(CASES))
        return
    rows = []
    for name in args.case or list(CASES):
        durability.progress(f"{name} ...")
        rows.append(CASES[name](args))
        durability.progress(f"{name}: {rows[-1]['result']}")
    print(json.dumps(rows, indent=1, ensure_ascii=False) if args.json else table(rows))
    sys.exit(0 if all(r["met"] for r in rows) else 1)


if __name__ == "__main__":
    main()
