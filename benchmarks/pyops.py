"""The Python bytecodes a program runs, by function, from a signal on: how much Python a
gateway's turn runs and where, as a count that no machine's speed moves.

    python benchmarks/pyops.py OUT.json -m prefixgate.cli serve --config cfg.json
    python benchmarks/pyops.py --diff A.json B.json [--per N] [--top K]

The first form runs the module with every thread traced opcode by opcode
(``sys.settrace`` with ``f_trace_opcodes``: a program runs ~100× slower, so read counts,
never times). SIGUSR1 forgets what was counted until then (the start-up, a warm-up); the
counts, by (file, first line, function), are written to ``OUT.json`` when the program
exits. ``agent_turns.py --opcodes DIR`` runs its gateways this way.

``--diff`` prints what ``A`` runs more than ``B`` (two subjects of the same turns), by
module and by function, each divided by ``--per`` (the turns counted), and their totals.
Callgrind counts the interpreter's instructions but not which Python function they
serve; this says which, in bytecodes (a bytecode that calls into C counts one).
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pyprofile import run_module  # noqa: E402

_counts: collections.Counter[tuple[str, int, str]] = collections.Counter()


def _trace(frame, event: str, arg: Any):
    frame.f_trace_opcodes = True
    if event == "opcode":
        code = frame.f_code
        _counts[(code.co_filename, code.co_firstlineno, code.co_name)] += 1
    return _trace


def _forget(signum, frame) -> None:
    _counts.clear()


def _short(path: str) -> str:
    """``record/cut.py`` for the package's files, the path itself for the others."""
    return path.rsplit("/prefixgate/", 1)[-1]


def run(out: str, argv: list[str]) -> None:
    signal.signal(signal.SIGUSR1, _forget)
    threading.settrace(_trace)
    sys.settrace(_trace)
    try:
        run_module(argv, "usage: pyops.py OUT.json -m MODULE [ARGS...]")
    finally:
        sys.settrace(None)
        threading.settrace(None)
        rows = [[_short(f), line, name, n] for (f, line, name), n in _counts.most_common()]
        with open(out, "w", encoding="utf-8") as fh:
            json.dump(rows, fh)


def load(path: str) -> collections.Counter[tuple[str, int, str]]:
    with open(path, encoding="utf-8") as fh:
        return collections.Counter({(f, line, name): n for f, line, name, n in json.load(fh)})


def diff(a: str, b: str, per: float, top: int) -> str:
    ca, cb = load(a), load(b)
    more = ca.copy()
    more.subtract(cb)
    by_module: collections.Counter[str] = collections.Counter()
    for (f, _, _), n in more.items():
        by_module[f] += n
    lines = [
        f"{a}: {sum(ca.values()) / per:,.0f} bytecodes a turn; {b}: {sum(cb.values()) / per:,.0f};"
        f" the difference {sum(more.values()) / per:,.0f}",
        "",
        "by module (the difference, a turn):",
    ]
    lines += [f"{n / per:9,.0f}  {f}" for f, n in by_module.most_common(top)]
    lines += ["", "by function (the difference, a turn):"]
    lines += [f"{n / per:9,.0f}  {f}:{line} {name}" for (f, line, name), n in more.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--diff":
        ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        ap.add_argument("--diff", nargs=2, metavar=("A", "B"), required=True)
        ap.add_argument("--per", type=float, default=1.0, help="divide by this (the turns)")
        ap.add_argument("--top", type=int, default=30)
        args = ap.parse_args()
        print(diff(args.diff[0], args.diff[1], args.per, args.top))
        return
    # (OUT.json never starts with a dash: ``--help`` and the like print the usage, where
    # they would have been taken for the file to write)
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        raise SystemExit(__doc__)
    run(sys.argv[1], sys.argv[2:])


if __name__ == "__main__":
    main()
