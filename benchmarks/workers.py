"""Does the gateway scale with worker processes? Requests per second, or long streams.

    python benchmarks/workers.py [--workers 1 2] [--seconds 4] [--repeats 3] [--json]
    python benchmarks/workers.py --streams [--workers 1 2 3] [--slice 0.3] [--bound-ms 10]
                                 [--chunks 200] [--ramp 3] [--start 100] [--json]
    python benchmarks/workers.py --streams --per-worker 100,130 [--repeats 3]

**Requests per second** (the default): ``prefixgate serve --workers N`` (no store) against
the fast fake upstream of ``overhead.py``, at concurrency 32, for
``/v1/chat/completions`` and ``/v1/messages`` (the Claude Code request), non-streaming and
streaming. On a small machine the load generator and the fake upstream need CPU too; run
at normal priority they would sit in the run queue behind a busy worker and starve it of
requests, which measures the scheduler, not the gateway. So both run at real-time
priority (``SCHED_FIFO``, when the process may set it; else at the highest nice level it
may): they take the CPU they need the moment they need it, and the workers share the rest.
The workers are not pinned. The figure is requests/s per worker count, and the ratio to
one worker.

**Streams** (``--streams``): how many long streams N workers relay, each worker on a CPU
slice of its own of equal size. ``streams.py``'s paced upstream (``--chunks`` SSE chunks
``--gap`` apart) and load generator run in this process on core 1; the gateway
(``prefixgate serve --workers N``, SQLite store) is pinned to core 0, and each worker
process is put in a cgroup of its own whose CPU quota is ``--slice`` of a core
(``slices.py``; a CFS period of ``--period-ms``), so N workers have N slices, as N cores
would give them, on a machine with fewer cores. A level passes when every stream
completes (none refused, reset, cut or stalled) and the gateway adds at most ``--bound-ms``
to the inter-chunk gap p99 of the direct path at the same N (measured in the same run).
For one worker, N starts at ``--start`` and doubles until a level fails, then bisects
(``--steps`` grid points a doubling); for N workers the search starts at N times one
worker's capacity. The figures: the largest N that passed per worker count, the ratio to
one worker (the goal is N), and for every level run the gaps, the CPU per relayed chunk,
the streams each worker took, each worker's share of a core and how often its quota
throttled it, the counts and the records against the streams answered. With
``--per-worker L,…`` there is no search: each worker count w runs w × L streams for each
L, the counts one after the other, ``--repeats`` times (the machine's drift then falls on
every count alike): scaling is the same gaps at the same load a worker. Without writable cgroups the workers are only
pinned, one core each, and counts that do not fit the machine are left out (said in the
output). Progress on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead  # noqa: E402
import workers_streams  # noqa: E402

CASES = [
    ("chat", False, 32, "fake"),
    ("chat", True, 32, "fake"),
    ("messages", False, 32, "fake"),
    ("messages", True, 32, "fake"),
]


def _realtime() -> str:
    """Raise this process (and what it starts) to real-time priority, if allowed."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        return "SCHED_FIFO"
    except (PermissionError, OSError, AttributeError):
        try:
            os.nice(-20)
            return "nice -20"
        except OSError:
            return "normal (no permission to raise it)"


def _normal() -> None:
    """In a child that must not inherit the real-time priority (the gateway)."""
    with contextlib.suppress(PermissionError, OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    with contextlib.suppress(PermissionError, OSError):
        os.setpriority(os.PRIO_PROCESS, 0, 0)


class Args:
    litellm_version = overhead.LITELLM_VERSION

    def __init__(self, workers: int) -> None:
        self.workers = workers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--workers", type=int, nargs="+", default=None, help="default: 1 2 (--streams: 1 2 3)"
    )
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--streams", action="store_true", help="long streams on CPU slices")
    workers_streams.add_options(ap)
    args = ap.parse_args()
    if args.streams:
        args.workers = args.workers or [1, 2, 3]
        workers_streams.main(args)
        return
    args.workers = args.workers or [1, 2]
    anth, chat = overhead.bodies()
    work = Path(tempfile.mkdtemp(prefix="prefixgate-workers-"))
    priority = _realtime()  # the load generator (this process) and the upstream (its child)
    port = overhead.free_port()
    upstream = subprocess.Popen(
        [sys.executable, str(overhead.HERE / "overhead_upstream.py"), "--port", str(port)]
    )
    up_url = f"http://127.0.0.1:{port}"
    rps: dict[str, dict[int, list[float]]] = {}
    try:
        overhead.wait_http(up_url + "/health", upstream)
        for rep in range(args.repeats):
            for n in args.workers:
                print(f"repeat {rep + 1}/{args.repeats}: {n} worker(s)", file=sys.stderr)
                gw = overhead.Gateway("prefixgate-nostore", work, up_url, Args(n))
                cmd, env, health = gw.command()
                gw.log = open(work / f"workers-{n}.log", "ab")  # noqa: SIM115
                gw.proc = subprocess.Popen(
                    cmd, env=env, stdout=gw.log, stderr=subprocess.STDOUT, preexec_fn=_normal
                )
                try:
                    overhead.wait_http(gw.url + health, gw.proc)
                    overhead._arun(overhead._warm(gw.url, gw.name, anth, chat))
                    for case in CASES:
                        u, body, headers = overhead.request_of(gw.name, gw.url, case, anth, chat)
                        res = overhead._arun(
                            overhead.load.run(
                                u, body, headers, concurrency=32, seconds=args.seconds
                            )
                        )
                        name = overhead.case_name(case)
                        rps.setdefault(name, {}).setdefault(n, []).append(res.rps)
                        if res.errors:
                            print(f"  {name}: {res.errors} errors", file=sys.stderr)
                finally:
                    gw.stop()
    finally:
        overhead.stop(upstream)
    summary = {
        "priority_of_load_and_upstream": priority,
        "cpus": os.cpu_count(),
        "cases": {
            name: {str(n): statistics.median(v) for n, v in per.items()}
            for name, per in rps.items()
        },
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    base = args.workers[0]
    print(f"load generator and upstream at {priority}; {os.cpu_count()} CPUs")
    head = f"{'case':<22}" + "".join(f"{str(n) + ' worker(s) rps':>20}" for n in args.workers)
    print(head + f"{'ratio':>10}")
    for name, per in summary["cases"].items():
        row = f"{name:<22}" + "".join(f"{per[str(n)]:>20.0f}" for n in args.workers)
        print(row + f"{per[str(args.workers[-1])] / per[str(base)]:>9.2f}x")


if __name__ == "__main__":
    main()
