"""Run a Python program under cProfile, every thread, from a signal on: where a benchmark's
gateway spends its Python time, by function (callgrind counts the interpreter, not the
functions it runs).

    python benchmarks/pyprofile.py OUT.pstats -m prefixgate.cli serve --config cfg.json

Every thread is profiled from its start; SIGUSR1 forgets what was counted until then (the
start-up, a warm-up), and the profiles of all threads are merged into ``OUT.pstats`` when
the program exits (SIGTERM included): read it with ``python -m pstats OUT.pstats``.
cProfile's own cost is large per call, so read the calls and the shares, not the times.
"""

from __future__ import annotations

import contextlib
import cProfile
import pstats
import runpy
import signal
import sys
import threading

_profiles: list[cProfile.Profile] = []
_lock = threading.Lock()


def _start_here() -> None:
    p = cProfile.Profile()
    with _lock:
        _profiles.append(p)
    p.enable()


def _thread_hook(frame, event, arg) -> None:  # a thread's first call: its own profile
    sys.setprofile(None)
    _start_here()


def _on_usr1(signum, frame) -> None:
    """What was counted so far (start-up, the warm-up) is forgotten, in every thread."""
    with _lock:
        for p in _profiles:
            p.clear()


def _write(out: str) -> None:
    merged: pstats.Stats | None = None
    with _lock:
        for p in _profiles:
            p.disable()
            merged = pstats.Stats(p) if merged is None else (merged.add(p) or merged)
    if merged is not None:
        merged.dump_stats(out)


def run_module(argv: list[str], usage: str) -> None:
    """Run ``-m MODULE [ARGS...]`` (``argv``) as ``python -m`` would, until it exits;
    ``usage`` when ``argv`` is not that. For this tool and ``pyops.py``."""
    if len(argv) < 2 or argv[0] != "-m":
        raise SystemExit(usage)
    sys.argv = [argv[1], *argv[2:]]
    with contextlib.suppress(SystemExit):
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


def main() -> None:
    out = sys.argv[1]
    signal.signal(signal.SIGUSR1, _on_usr1)
    threading.setprofile(_thread_hook)
    _start_here()
    try:
        run_module(sys.argv[2:], "usage: pyprofile.py OUT -m MODULE [ARGS...]")
    finally:
        _write(out)


if __name__ == "__main__":
    main()
