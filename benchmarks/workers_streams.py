"""``workers.py --streams``: the most long streams N workers relay within a bound, each
worker on a CPU slice of its own (``slices.py``), with ``streams.py``'s paced upstream,
load generator and levels. The method is in ``workers.py``'s docstring."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import streams  # noqa: E402
import streams_load as sl  # noqa: E402
from overhead import GATEWAY_CPU, LOAD_CPU, cpu_seconds, tree  # noqa: E402
from slices import Slices, pin  # noqa: E402

_say = streams._say


class Placement:
    """Where the gateway's processes run: each worker in its slice (or on a core of its
    own without cgroups), all on the gateway's core."""

    def __init__(self, slices: Slices, fraction: float) -> None:
        self.slices, self.fraction = slices, fraction
        self.groups: list = []  # one a worker, made when first needed, kept for the run
        self.cores = sorted(os.sched_getaffinity(0) - {LOAD_CPU})

    def fits(self, workers: int) -> str | None:
        """Why ``workers`` cannot be placed, or None."""
        if self.slices.available:
            if workers * self.fraction > 1:
                return f"{workers} slices of {self.fraction} exceed one core"
            return None
        if workers > len(self.cores):
            return f"{workers} workers need {workers} cores apart from the load's"
        return None

    def place(self, parent: int, workers: list[int]) -> None:
        pin(parent, {GATEWAY_CPU})
        for i, pid in enumerate(workers):
            if not self.slices.available:
                pin(pid, {self.cores[i]})
                continue
            pin(pid, {GATEWAY_CPU})
            while len(self.groups) <= i:
                self.groups.append(self.slices.make(f"w{len(self.groups)}", self.fraction))
            self.groups[i].add(pid)

    def throttled(self, workers: int) -> list[dict[str, int]]:
        if not self.slices.available:
            return [{} for _ in range(workers)]
        return [g.stat() for g in self.groups[:workers]]


class SlicedSubject(streams.Subject):
    """``streams.py``'s gateway under test, its workers placed once they all listen.
    Each worker's CPU time and quota throttling are read where ``streams.measure`` scrapes
    ``/metrics``: just before the level's streams start and just after they end; then
    also the streams each worker relayed (its own ``/metrics``)."""

    placement: Placement

    async def start(self) -> None:
        await super().start()
        n = self.args.workers
        deadline = time.monotonic() + 60
        while True:  # every worker forked and answering (the kernel picks who answers)
            pids = [self.proc.pid] if n == 1 else tree(self.proc.pid)[1:]
            if len(pids) == n and len(await self._by_worker(set(pids))) == n:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"{n} workers did not all come up ({pids})")
            await asyncio.sleep(0.1)
        self.workers = sorted(pids)
        self.placement.place(self.proc.pid, self.workers)
        self.samples: list[tuple[float, list[float], list[dict]]] = []
        self.streams: list[int] = []

    async def _by_worker(self, pids: set[int], tries: int = 200) -> dict[int, str]:
        """``/metrics`` of each of ``pids`` (by ``prefixgate_worker_info``), scraped on a
        new connection each time until all have answered or ``tries`` ran out."""
        seen: dict[int, str] = {}
        for _ in range(tries):
            text = (await streams.http_get(self.url + "/metrics", 2))[1].decode()
            pid = re.search(r'^prefixgate_worker_info\{pid="(\d+)"\}', text, re.M)
            if pid:
                seen[int(pid.group(1))] = text
            if set(seen) >= pids:
                break
        return seen

    async def metrics(self) -> str:
        cpu = [cpu_seconds(p) for p in self.workers]
        self.samples.append((time.monotonic(), cpu, self.placement.throttled(len(self.workers))))
        if len(self.samples) == 2:  # the level is over
            texts = await self._by_worker(set(self.workers))
            self.streams = [_relayed(texts.get(p, "")) for p in self.workers]
        return await super().metrics()

    def per_worker(self) -> dict:
        """Each worker's streams, its share of a core over the level, and the share of its
        quota's periods in which it was throttled."""
        (t0, cpu0, th0), (t1, cpu1, th1) = self.samples[0], self.samples[-1]
        pairs = zip(cpu0, cpu1, strict=True)
        out: dict = {
            "worker_streams": self.streams,
            "worker_cpu": [round((b - a) / (t1 - t0), 3) for a, b in pairs],
        }
        if th1 and th1[0]:
            out["throttled"] = [_throttled(a, b) for a, b in zip(th0, th1, strict=True)]
        return out


def _relayed(metrics: str) -> int:
    """Requests for the level's model (``fake``, not the warm-up's) a worker finished."""
    pattern = r'^prefixgate_requests_total\{[^}]*model="fake"[^}]*\} (\S+)$'
    return round(sum(float(v) for v in re.findall(pattern, metrics, re.M)))


def _throttled(before: dict[str, int], after: dict[str, int]) -> float:
    periods = after["nr_periods"] - before["nr_periods"]
    return round((after["nr_throttled"] - before["nr_throttled"]) / max(1, periods), 3)


def n_at(args, k: int) -> int:
    """The level ``k`` grid points above ``--start`` (``--steps`` a doubling)."""
    return max(1, round(args.start * 2 ** (k / args.steps)))


def passed(row: dict, args) -> bool:
    added = row.get("added_gap_p99_ms")
    return (
        row["completed"] == row["n"]
        and not row["stalled"]
        and added is not None
        and added <= args.bound_ms
    )


class Search:
    """The largest level a worker count passes: from a first guess, by ``step`` grid points
    until the outcome changes, then bisection; at most ``--max-levels`` levels."""

    def __init__(self, runner: Runner, workers: int) -> None:
        self.runner, self.workers = runner, workers
        self.outcome: dict[int, bool] = {}

    async def probe(self, k: int) -> bool:
        if k not in self.outcome:
            row = await self.runner.level(self.workers, n_at(self.runner.args, k))
            self.outcome[k] = passed(row, self.runner.args)
        return self.outcome[k]

    async def run(self, k: int, step: int) -> int | None:
        """The grid index of the largest level passed (None: not even the smallest)."""
        args = self.runner.args
        budget = args.max_levels
        lo = hi = None
        if await self.probe(k):
            lo = k
            while len(self.outcome) < budget and n_at(args, lo + step) <= args.max_n:
                if not await self.probe(lo + step):
                    hi = lo + step
                    break
                lo += step
        else:
            hi = k
            while len(self.outcome) < budget and n_at(args, hi - step) >= 10:
                if await self.probe(hi - step):
                    lo = hi - step
                    break
                hi -= step
        while lo is not None and hi is not None and hi - lo > 1 and len(self.outcome) < budget:
            mid = (lo + hi) // 2
            if await self.probe(mid):
                lo = mid
            else:
                hi = mid
        return lo


class Runner:
    def __init__(self, args, upstream_url: str, work: Path, placement: Placement) -> None:
        self.args, self.upstream_url, self.work, self.placement = (
            args,
            upstream_url,
            work,
            placement,
        )
        self.direct: dict[int, dict] = {}
        self.rows: list[dict] = []

    async def level(self, workers: int, n: int) -> dict:
        args = self.args
        if n not in self.direct:
            _say(f"N={n}: direct")
            self.direct[n] = await streams.measure("direct", n, self.upstream_url, self.work, args)
        _say(f"N={n}: {workers} worker(s)")
        subjects: list[SlicedSubject] = []

        def make(*a) -> SlicedSubject:
            s = SlicedSubject(*a)
            s.placement = self.placement
            subjects.append(s)
            return s

        wargs = _with(args, workers=workers)
        row = await streams.measure("prefixgate", n, self.upstream_url, self.work, wargs, make)
        row.update(streams.added(row, self.direct[n]))
        row.update(subjects[0].per_worker())
        row["workers"] = workers
        row["passed"] = passed(row, args)
        row["direct_gap_p99_ms"] = self.direct[n]["gap_p99_ms"]
        _say(
            f"  {workers} worker(s) N={n}: {'passed' if row['passed'] else 'failed'} "
            f"(added gap p99 {row.get('added_gap_p99_ms')} ms, completed {row['completed']}, "
            f"stalled {row['stalled']}, CPU {row.get('worker_cpu')})"
        )
        self.rows.append(row)
        return row


def _with(args, **kw) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), **kw})


def _load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def run(args) -> dict:
    os.sched_setaffinity(0, {LOAD_CPU})
    work = Path(tempfile.mkdtemp(prefix="prefixgate-workers-streams-"))
    server, upstream_url = await sl.serve_paced(args.chunks, args.gap)
    fraction = args.slice or round(min(0.35, 0.9 / max(args.workers)), 3)
    result: dict = {
        "chunks": args.chunks,
        "gap_ms": args.gap * 1000,
        "ramp_s": args.ramp,
        "bound_ms": args.bound_ms,
        "load_average_start": _load_average(),
        "runs": [],
    }
    with Slices(period_us=round(args.period_ms * 1000)) as slices:
        if slices.available:
            load = slices.make("load", None)  # the load side: its weight, no quota
            load.add(os.getpid())
            result["placement"] = (
                f"cgroup CPU slices: each worker {fraction} of core {GATEWAY_CPU} "
                f"(CFS period {args.period_ms} ms); upstream and load generator on core {LOAD_CPU}"
            )
        else:
            result["placement"] = (
                f"taskset only ({slices.why_not}): one core a worker, no slices; "
                f"upstream and load generator on core {LOAD_CPU}"
            )
        result["slice"] = fraction if slices.available else 1.0
        _say(result["placement"])
        placement = Placement(slices, fraction)
        runner = Runner(args, upstream_url, work, placement)
        try:
            if args.per_worker:
                await fixed_loads(args, runner, placement, result)
            else:
                await capacities(args, runner, placement, result)
        finally:
            server.close()
    result["load_average_end"] = _load_average()
    result["direct"] = {str(n): r for n, r in sorted(runner.direct.items())}
    return result


async def capacities(args, runner: Runner, placement: Placement, result: dict) -> None:
    """The largest level each worker count passes, and the ratio to the first count's."""
    base: int | None = None
    for w in args.workers:
        why = placement.fits(w)
        if why:
            _say(f"{w} worker(s): left out: {why}")
            result["runs"].append({"workers": w, "left_out": why})
            continue
        search = Search(runner, w)
        if base is None:
            k = await search.run(0, args.steps)
            base = k
        else:
            goal = base + round(args.steps * math.log2(w / args.workers[0]))
            k = await search.run(goal, max(1, args.steps // 2))
        result["runs"].append(
            {
                "workers": w,
                "capacity": None if k is None else n_at(args, k),
                "levels": [r for r in runner.rows if r["workers"] == w],
            }
        )
    caps = {r["workers"]: r.get("capacity") for r in result["runs"] if r.get("capacity")}
    first = caps.get(args.workers[0])
    result["ratio"] = {str(w): round(c / first, 2) for w, c in caps.items()} if first else {}


async def fixed_loads(args, runner: Runner, placement: Placement, result: dict) -> None:
    """``--per-worker L,…``: w workers at w × L streams for each worker count, one after
    the other (so that the machine's drift falls on every count alike), ``--repeats``
    times: at the same load a worker, the same gaps is what scaling means."""
    counts = [w for w in args.workers if not placement.fits(w)]
    for w in sorted(set(args.workers) - set(counts)):
        result["runs"].append({"workers": w, "left_out": placement.fits(w)})
    for rep in range(args.repeats):
        for load in args.per_worker:
            for w in counts:
                _say(f"repeat {rep + 1}/{args.repeats}, {load} streams a worker")
                row = await runner.level(w, w * load)
                row.update(per_worker_load=load, repeat=rep)
    summary = []
    for load in args.per_worker:
        for w in counts:
            rows = [r for r in runner.rows if r["workers"] == w and r["per_worker_load"] == load]
            summary.append(
                {
                    "per_worker_load": load,
                    "workers": w,
                    "n": w * load,
                    "passed": sum(r["passed"] for r in rows),
                    "runs": len(rows),
                    "added_gap_p99_ms": [r.get("added_gap_p99_ms") for r in rows],
                    "cpu_us_per_chunk": [r["cpu_us_per_chunk"] for r in rows],
                    "throttled_max": [max(r.get("throttled") or [0]) for r in rows],
                }
            )
    result["fixed"] = summary
    result["runs"].append({"levels": runner.rows})


# -- the table ------------------------------------------------------------------------------
def _f(v, fmt="{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _order(row: dict) -> tuple:
    return (row.get("per_worker_load", 0), row["workers"], row["n"], row.get("repeat", 0))


def table(result: dict) -> str:
    lines = [
        result["placement"],
        f"streams of {result['chunks']} chunks {result['gap_ms']:g} ms apart, ramped over "
        f"{result['ramp_s']:g} s; a level passes when every stream completes and the added gap "
        f"p99 is at most {result['bound_ms']:g} ms; load average {result['load_average_start']} "
        f"at the start, {result['load_average_end']} at the end",
        "",
    ]
    cols = [
        ("workers", lambda r: str(r["workers"])),
        ("N", lambda r: str(r["n"])),
        ("pass", lambda r: "yes" if r["passed"] else "no"),
        (
            "gap p50/p99/max ms",
            lambda r: "/".join(_f(r[k]) for k in ("gap_p50_ms", "gap_p99_ms", "gap_max_ms")),
        ),
        ("direct p99", lambda r: _f(r.get("direct_gap_p99_ms"))),
        ("added p99", lambda r: _f(r.get("added_gap_p99_ms"))),
        ("TTFT p99 ms", lambda r: _f(r["ttft_p99_ms"])),
        ("CPU µs/chunk", lambda r: _f(r["cpu_us_per_chunk"])),
        ("streams each worker", lambda r: " ".join(str(c) for c in r.get("worker_streams", []))),
        ("CPU each worker", lambda r: " ".join(_f(c, "{:.0%}") for c in r.get("worker_cpu", []))),
        ("throttled", lambda r: " ".join(_f(c, "{:.0%}") for c in r.get("throttled", []))),
        ("load CPU", lambda r: _f(r["load_side_cpu_share"], "{:.0%}")),
        (
            "done/refused/reset/cut/stall",
            lambda r: f"{r['completed']}/{r['refused']}/{r['reset']}/{r['cut']}/{r['stalled']}",
        ),
        ("records/answered", lambda r: f"{_f(r['records'], '{}')}/{r['answered']}"),
    ]
    rows = [
        lv for run in result["runs"] for lv in sorted(run.get("levels", []), key=lambda r: r["n"])
    ]
    cells = [[name for name, _ in cols]] + [[f(r) for _, f in cols] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.append("")
    for f in result.get("fixed", []):
        added = sorted(a for a in f["added_gap_p99_ms"] if a is not None)
        lines.append(
            f"{f['per_worker_load']} streams a worker, {f['workers']} worker(s) (N = {f['n']}): "
            f"passed {f['passed']}/{f['runs']}, added gap p99 "
            + " / ".join(_f(a) for a in f["added_gap_p99_ms"])
            + f" ms (median {_f(added[len(added) // 2] if added else None)}), CPU µs/chunk "
            + " / ".join(_f(c) for c in f["cpu_us_per_chunk"])
        )
    for run in result["runs"]:
        w = run.get("workers")
        if "capacity" not in run and "left_out" not in run:
            continue
        if "left_out" in run:
            lines.append(f"{w} worker(s): left out ({run['left_out']})")
            continue
        ratio = result["ratio"].get(str(w))
        lines.append(
            f"{w} worker(s) on {w} slice(s) of {result['slice']:g}: the most streams within the "
            f"bound {_f(run['capacity'], '{}')}"
            + (f", {ratio:.2f}x one worker's" if ratio and w != 1 else "")
        )
    return "\n".join(lines)


def add_options(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("--streams")
    g.add_argument(
        "--slice",
        type=float,
        default=0.0,
        help="share of a core a worker (default: 0.35, or 0.9 / the most workers when smaller)",
    )
    g.add_argument("--period-ms", type=float, default=10.0, help="the CFS quota's period")
    g.add_argument("--bound-ms", type=float, default=10.0, help="added inter-chunk gap p99 allowed")
    g.add_argument("--chunks", type=int, default=200)
    g.add_argument("--gap", type=float, default=0.025, help="seconds between chunks")
    g.add_argument("--ramp", type=float, default=3.0, help="seconds to start a level's streams")
    g.add_argument("--start", type=int, default=100, help="one worker's first level")
    g.add_argument("--steps", type=int, default=6, help="levels a doubling (the search's grid)")
    g.add_argument("--max-levels", type=int, default=7, help="levels at most a worker count")
    g.add_argument("--max-n", type=int, default=6000)
    g.add_argument(
        "--per-worker",
        type=lambda v: [int(x) for x in v.split(",") if x],
        default=None,
        help="instead of the search: w workers at w × each of these loads (--repeats times)",
    )
    g.add_argument("--set", action="append", help="a gateway setting: server.max_in_flight=500")


def main(args) -> None:
    args.litellm_version = None
    try:
        import uvloop

        result = uvloop.run(run(args))
    except ImportError:
        result = asyncio.run(run(args))
    print(json.dumps(result, indent=2) if args.json else table(result))
