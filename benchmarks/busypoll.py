"""Busy polling's gain and cost, measured in one run (docs/performance.md).

    python benchmarks/busypoll.py [--rounds 4] [--seconds 1.2] [--streams 50] [--json]

Two gateways of the same code, ``server.busy_poll_us`` 0 (the default) and 200 (the
opt-in), in front of the fast fake upstream (``overhead_upstream.py``), placed as
``overhead.py`` places them (the gateways on core 0, the upstream and the load on core 1):

- the gain: latency at concurrency 1 (chat json, messages json, the first token of a
  messages stream), "added" over the direct path of the same round, medians over rounds
  whose order alternates;
- the cost: each gateway's CPU, in seconds per second of wall time (``/proc``), while
  ``--streams`` slow streams run at once (64 events 50 ms apart each, as a model decodes),
  and the streams completed per second (the same work on both).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as ov  # noqa: E402
import overhead_ab as ab  # noqa: E402
import overhead_load as load  # noqa: E402
import overhead_upstream as fake  # noqa: E402

ON_US = 200
LATENCY_CASES = [("chat", False, 1, "fake"), ("messages", False, 1, "fake")]
LATENCY_CASES.append(("messages", True, 1, "fake"))


async def slow_streams(url: str, pid: int, anth: dict, chat: dict, n: int, seconds: float):
    """CPU seconds per second of the gateway ``pid`` while ``n`` slow streams run."""
    u, body, headers = ov.request_of("gateway", url, ("chat", True, n, "fake-slow"), anth, chat)
    cpu0, t0 = ov.cpu_seconds(pid), time.monotonic()
    res = await load.run(u, body, headers, concurrency=n, seconds=seconds, warmup=0.0)
    cpu, wall = ov.cpu_seconds(pid) - cpu0, time.monotonic() - t0
    return {"cpu_per_s": cpu / wall, "streams_per_s": res.rps, "errors": res.errors}


def run(args) -> dict:
    anth, chat = ov.bodies()
    work = Path(tempfile.mkdtemp(prefix="prefixgate-busypoll-"))
    os.sched_setaffinity(0, {ov.LOAD_CPU})
    sides = {
        "off": ab.Side("off", None, ["server.busy_poll_us=0"], work, False),
        "on": ab.Side("on", None, [f"server.busy_poll_us={ON_US}"], work, False),
    }
    latency: dict[tuple[str, str], list[float]] = {}
    cost: dict[str, list[dict]] = {"off": [], "on": []}
    with fake.Running(ov.LOAD_CPU) as upstream:
        try:
            measure_sides(args, sides, upstream.url, anth, chat, latency, cost)
        finally:
            for side in sides.values():
                side.stop()
    return summarize(latency, cost, args)


def measure_sides(args, sides: dict, up_url: str, anth, chat, latency: dict, cost: dict) -> None:
    """Both sides started, then the rounds: latency cases, then the slow streams."""
    for side in sides.values():
        side.start(up_url)
        for case in LATENCY_CASES:  # warm-up
            ov._arun(ab.measure(side.url, "gateway", case, anth, chat, 0.3))
    for r in range(args.rounds):
        order = list(sides.values()) if r % 2 == 0 else list(sides.values())[::-1]
        for case in LATENCY_CASES:
            direct = ov._arun(ab.measure(up_url, "direct", case, anth, chat, args.seconds))
            for side in order:
                got = ov._arun(ab.measure(side.url, "gateway", case, anth, chat, args.seconds))
                key = "ttft" if case[1] else "p50"
                latency.setdefault((ov.case_name(case), side.name), []).append(
                    got[key] - direct[key]
                )
        for side in order:
            cost[side.name].append(
                ov._arun(
                    slow_streams(
                        side.url, side.proc.pid, anth, chat, args.streams, args.stream_seconds
                    )
                )
            )
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)


def summarize(latency: dict, cost: dict, args) -> dict:
    med = statistics.median
    cases = {}
    for case in LATENCY_CASES:
        name = ov.case_name(case) + ("/first-token" if case[1] else "")
        off, on = (
            med(latency[(ov.case_name(case), "off")]),
            med(latency[(ov.case_name(case), "on")]),
        )
        cases[name] = {"off_ms": off, "on_ms": on, "gain_ms": off - on}
    streams = {
        side: {
            "cpu_per_s": med(r["cpu_per_s"] for r in rows),
            "streams_per_s": med(r["streams_per_s"] for r in rows),
            "errors": sum(r["errors"] for r in rows),
        }
        for side, rows in cost.items()
    }
    off_cpu, on_cpu = streams["off"]["cpu_per_s"], streams["on"]["cpu_per_s"]
    return {
        "busy_poll_us": ON_US,
        "rounds": args.rounds,
        "latency_added_ms": cases,
        "slow_streams": {
            "streams": args.streams,
            **streams,
            "cpu_cost_pct": 100 * (on_cpu - off_cpu) / off_cpu if off_cpu else None,
        },
    }


def table(s: dict) -> str:
    lines = [
        f"busy polling off (0, the default) vs on ({s['busy_poll_us']} us); "
        f"{s['rounds']} rounds, medians",
        "",
        f"{'latency at c1, added over direct (ms)':<40}{'off':>8}{'on':>8}{'gain':>8}",
    ]
    for name, row in s["latency_added_ms"].items():
        lines.append(f"{name:<40}{row['off_ms']:>8.3f}{row['on_ms']:>8.3f}{row['gain_ms']:>8.3f}")
    st = s["slow_streams"]
    cost = st["cpu_cost_pct"]
    lines += [
        "",
        f"{st['streams']} slow streams at once (64 events 50 ms apart){'off':>5}{'on':>8}{'cost':>8}",
        f"{'gateway CPU, seconds per second':<40}{st['off']['cpu_per_s']:>8.3f}"
        f"{st['on']['cpu_per_s']:>8.3f}{'-' if cost is None else f'{cost:+.0f}%':>8}",
        f"{'streams completed per second':<40}{st['off']['streams_per_s']:>8.1f}"
        f"{st['on']['streams_per_s']:>8.1f}",
    ]
    errors = st["off"]["errors"] + st["on"]["errors"]
    if errors:
        lines.append(f"{errors} streams failed")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=1.2, help="per latency turn")
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--stream-seconds", type=float, default=8.0, help="per slow-stream turn")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    summary = run(args)
    print(json.dumps(summary, indent=1) if args.json else table(summary))


if __name__ == "__main__":
    main()
