"""Agent-scale streaming: thousands of long streams through one gateway worker, in one run.

    python benchmarks/streams.py [--levels 100,300,1000,2000,4000] [--json] [--no-litellm]
                                 [--chunks 400] [--gap 0.025] [--ramp 5] [--soak 100000]
                                 [--set server.max_in_flight=500] [--workers N]
                                 [--floor] [--before GIT_REF]

A paced upstream (`streams_load.py`: 400 SSE chunks, one every 25 ms, a 10-second stream
like an agent turn at 40 tokens/s) and the load generator run in this process, pinned to
core 1; the gateway (`prefixgate serve`, SQLite store with segment capture, default
settings but for ``--set`` and ``server.loop_watch`` on) is one process pinned to core 0. Loopback only. At each level,
N streams start evenly over ``--ramp`` seconds, half ``/v1/messages`` and half
``/v1/chat/completions`` (with ``include_usage``), ~2 KB prompts; ``direct`` sends the
same number of chat streams to the upstream itself, and with ``--floor`` through a bare
uvloop relay (``overhead_floor.py``: no parsing beyond the framing, one read and one
write a chunk), the least any Python relay costs on this machine. The gateway starts afresh for each
level. ``--before REF`` also runs the gateway as it was at a git ref (``prefixgate-before``,
checked out into a temporary worktree, the same settings), so a change's before and after
share one run; ``× floor`` is a relay's CPU a chunk over the floor's at the same level. With ``litellm`` installed (as `overhead.py` installs it), the LiteLLM proxy at
N = 100 in the same run.

Figures per level and path: inter-chunk gap p50 / p99 / max (and what the gateway added
to the direct path's at the same N), time to the first content event p50 / p99, the
gateway's CPU per relayed content chunk (over the whole level, requests' own work
included) and its share of the core, the relay's own CPU per chunk (user + system, and
user alone, over the steady window when every stream has started and none has ended:
nothing but chunks is relayed then), resident memory per
open stream (peak minus the level's start, over the most streams open at once), the
longest event-loop pause (``prefixgate_loop_lag_seconds`` from ``/metrics``: the bucket
it fell in) and garbage collections, completed / refused (an overloaded answer with
``retry-after``) / reset (no answer) / cut / stalled (a gap of a second or more, or
unfinished at the deadline) counts, and records written (rows in the store after the
gateway stopped) against streams answered. ``--soak S`` then sends S short streams, 250 at
a time, through one gateway and samples its memory (flat is the goal). Progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import streams_load as sl  # noqa: E402
from instructions import checked_out  # noqa: E402
from overhead import (  # noqa: E402
    GATEWAY_CPU,
    KEY,
    LITELLM_VERSION,
    LOAD_CPU,
    Gateway,
    cpu_seconds,
    cpu_times,
    free_port,
    rss_mib,
    stop,
)

PROMPT = (
    "Read the failing test's log below and find which change broke it; answer with the "
    "file and the line. " * 20
)[:2000]


def _say(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


# -- requests ---------------------------------------------------------------------------
def requests_for(target: str, url: str, model: str = "fake") -> list[sl.Request]:
    """Half Messages, half Chat (``direct`` and the floor: all Chat, as the gateway sends
    upstream)."""
    out = []
    for i in range(16):
        text = f"{PROMPT} (task {i})"
        chat = {
            "model": model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": text},
            ],
        }
        auth = {"authorization": f"Bearer {KEY}"}
        if target == "direct" or target.startswith("floor"):
            out.append(sl.request(url, "/v1/chat/completions", chat, auth))
            continue
        out.append(sl.request(url, "/v1/chat/completions", chat, auth))
        messages = {
            "model": model,
            "max_tokens": 1024,
            "stream": True,
            "system": "You are a coding agent.",
            "messages": [{"role": "user", "content": text}],
        }
        headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
        out.append(sl.request(url, "/v1/messages", messages, headers))
    return out


async def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """A bare ``GET`` (this loop also serves the upstream: no blocking client here)."""
    host, rest = url.removeprefix("http://").split(":", 1)
    port, _, path = rest.partition("/")
    r, w = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
    try:
        w.write(f"GET /{path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n".encode())
        data = await asyncio.wait_for(r.read(), timeout)
    finally:
        w.close()
    head, _, body = data.partition(b"\r\n\r\n")
    if b"chunked" in head.lower():
        out, rest_ = b"", body
        while rest_:
            size, _, rest_ = rest_.partition(b"\r\n")
            n = int(size, 16)
            out, rest_ = out + rest_[:n], rest_[n + 2 :]
            if not n:
                break
        body = out
    return int(head[9:12]), body


# -- the gateway under test -------------------------------------------------------------
class Subject:
    """prefixgate or LiteLLM, started afresh for a level (``overhead.Gateway``'s commands)."""

    def __init__(self, name: str, work: Path, upstream: str, args) -> None:
        # ``prefixgate-before``: the same gateway and settings, another tree's sources.
        self.kind = "prefixgate" if name.startswith("prefixgate") else name
        self.src = getattr(args, "before_src", None) if name == "prefixgate-before" else None
        if name != self.kind:
            work = work / name
            work.mkdir(exist_ok=True)
        self.gw = Gateway(self.kind, work, upstream, args)
        self.name, self.url, self.work, self.args = name, self.gw.url, work, args

    async def start(self) -> None:
        cmd, env, health = self.gw.command()
        if self.src is not None:
            env["PYTHONPATH"] = str(self.src)
        if self.kind == "prefixgate":
            self._configure()
        cpu = None if self.args.workers > 1 else GATEWAY_CPU
        self.log = open(self.work / f"{self.name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None,
        )
        deadline = time.monotonic() + 240
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.proc.returncode}")
            try:
                if self.name.startswith("floor"):  # it never closes a client: listening is up
                    host, port = self.url.removeprefix("http://").split(":")
                    _, w = await asyncio.open_connection(host, int(port))
                    w.close()
                    return
                if (await http_get(self.url + health, 2))[0] == 200:
                    return
            except (TimeoutError, OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{self.name} did not come up")
            await asyncio.sleep(0.2)

    def _configure(self) -> None:
        """``--set a.b=v`` on the config ``overhead.Gateway`` wrote."""
        path = self.work / f"{self.kind}.json"
        cfg = json.loads(path.read_text())
        cfg.setdefault("server", {})["loop_watch"] = True  # the loop's pauses on /metrics
        for item in self.args.set or ():
            key, _, value = item.partition("=")
            node = cfg
            *parents, leaf = key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = (
                json.loads(value) if re.match(r"^[-\d.\[{]|true|false|null", value) else value
            )
        path.write_text(json.dumps(cfg))
        self.db = Path(cfg["store"]["dsn"].removeprefix("sqlite:///")) if cfg.get("store") else None

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def metrics(self) -> str:
        if self.kind != "prefixgate":
            return ""
        try:
            return (await http_get(self.url + "/metrics"))[1].decode()
        except (TimeoutError, OSError):
            return ""

    def stop(self, keep: bool = False) -> int | None:
        """Stop it (SIGTERM: it drains and its records reach the store); the records of
        the level's streams (model ``fake``), for prefixgate; the store is removed unless
        ``keep``."""
        stop(self.proc)
        self.log.close()
        if self.kind != "prefixgate" or self.db is None or not self.db.exists():
            return None
        with sqlite3.connect(self.db) as db:
            n = db.execute("SELECT COUNT(*) FROM requests WHERE requested_model = 'fake'")
            count = n.fetchone()[0]
        if not keep:
            for p in self.db.parent.glob(self.db.name + "*"):
                p.unlink()
        return count


def _buckets(text: str, name: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for m in re.finditer(rf'^{name}_bucket\{{[^}}]*le="([^"]+)"[^}}]*\}} (\S+)$', text, re.M):
        le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
        out[le] = out.get(le, 0.0) + float(m.group(2))
    return out


def longest(before: str, after: str, name: str) -> tuple[float | None, float]:
    """(the smallest bucket bound that holds every observation made between the two
    scrapes, the count of observations) of a histogram; None when there were none or the
    metric is missing."""
    a, b = _buckets(before, name), _buckets(after, name)
    if not b:
        return None, 0.0
    new = {le: b[le] - a.get(le, 0.0) for le in b}
    total = new.get(float("inf"), 0.0)
    if not total:
        return None, 0.0
    for le in sorted(new):
        if new[le] >= total:
            return le, total
    return float("inf"), total  # pragma: no cover


# -- one level ----------------------------------------------------------------------------
async def measure(target: str, n: int, upstream_url: str, work: Path, args, make=Subject) -> dict:
    """One level: ``n`` streams through ``target`` (a ``make(...)``: a :class:`Subject`
    started afresh), or to the upstream itself (``direct``)."""
    subject = None
    url = upstream_url
    if target != "direct":
        subject = make(target, work, upstream_url, args)
        await subject.start()
        url = subject.url
        warm = await sl.run_level(requests_for(target, url, "warm-fast"), 32, 0.2, 20)
        if warm.completed != 32:
            _say(f"  {target}: warm-up: {warm.completed}/32 streams completed")
    reqs = requests_for(target, url)
    m0 = await subject.metrics() if subject else ""
    cpu0 = cpu_seconds(subject.pid) if subject else 0.0
    load0 = time.process_time()
    rss0 = rss_mib(subject.pid) if subject else 0.0
    peak = [rss0]

    window: list[tuple[float, tuple[float, float], int]] = []  # (t, (user, sys), chunks)

    def progress(lv: sl.Level, t: float) -> None:
        if subject is not None:
            peak[0] = max(peak[0], rss_mib(subject.pid))
            # The steady window: every stream started, none ended; the gateway does nothing
            # but relay chunks then, so its CPU over the chunks is the relay's own cost.
            if t >= args.ramp + 0.5 and lv.completed == 0:
                window.append((t, cpu_times(subject.pid), lv.chunks))
        _say(
            f"  {target} N={n} {t:5.1f}s open {lv.open_now:5d} (max {lv.open_max}) "
            f"done {lv.completed} refused {lv.refused} reset {lv.reset} chunks {lv.chunks}"
        )

    deadline = args.ramp + args.chunks * args.gap + 30
    lv = await sl.run_level(reqs, n, args.ramp, deadline, progress)
    cpu = (cpu_seconds(subject.pid) - cpu0) if subject else None
    load_cpu = time.process_time() - load0
    m1 = await subject.metrics() if subject else ""
    pause, _ = longest(m0, m1, "prefixgate_loop_lag_seconds")
    gc_pause, gcs = longest(m0, m1, "prefixgate_gc_pause_seconds")
    if args.workers > 1:  # the two scrapes may come from different workers: no figure
        pause = gc_pause = gcs = None
    records = subject.stop() if subject else None
    steady = steady_user = None
    if len(window) >= 2 and window[-1][2] > window[0][2]:
        (_, (u0, s0), c0), (_, (u1, s1), c1) = window[0], window[-1]
        steady = round(1e6 * ((u1 - u0) + (s1 - s0)) / (c1 - c0), 1)
        steady_user = round(1e6 * (u1 - u0) / (c1 - c0), 1)
    ms = lambda v: None if v is None else round(1000 * v, 2)  # noqa: E731
    ttfts = sorted(lv.ttfts)
    q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))] if xs else None  # noqa: E731
    return {
        "n": n,
        "gap_p50_ms": ms(lv.gap(0.5)),
        "gap_p99_ms": ms(lv.gap(0.99)),
        "gap_max_ms": ms(lv.gap_max()),
        "ttft_p50_ms": ms(q(ttfts, 0.5)),
        "ttft_p99_ms": ms(q(ttfts, 0.99)),
        "chunks": lv.chunks,
        "cpu_us_per_chunk": round(1e6 * cpu / lv.chunks, 1) if cpu and lv.chunks else None,
        "relay_cpu_us_per_chunk": steady,
        "relay_user_cpu_us_per_chunk": steady_user,
        "steady_window_s": round(window[-1][0] - window[0][0], 1) if len(window) >= 2 else None,
        "cpu_share": round(cpu / lv.seconds, 3) if cpu is not None and lv.seconds else None,
        "load_side_cpu_share": round(load_cpu / lv.seconds, 3) if lv.seconds else None,
        "rss_start_mib": round(rss0, 1) if subject else None,
        "rss_per_stream_kib": (
            round(1024 * (peak[0] - rss0) / lv.open_max, 1) if subject and lv.open_max else None
        ),
        "loop_pause_max_ms": ms(pause),
        "gc_pause_max_ms": ms(gc_pause),
        "gc_collections": gcs,
        "open_max": lv.open_max,
        "completed": lv.completed,
        "refused": lv.refused,
        "refused_without_retry_after": lv.refused_no_retry_after,
        "errors": lv.errors,
        "reset": lv.reset,
        "cut": lv.cut,
        "stalled": lv.stalled,
        "statuses": {str(k): v for k, v in sorted(lv.statuses.items())},
        "answered": lv.answered,
        "records": records,
        "seconds": round(lv.seconds, 1),
    }


def _relay(r: dict) -> str:
    if r.get("relay_cpu_us_per_chunk") is None:
        return "-"
    return f"{_f(r['relay_cpu_us_per_chunk'])} ({_f(r['relay_user_cpu_us_per_chunk'])})"


def added(row: dict, direct: dict) -> dict:
    out = {}
    for k in ("gap_p50_ms", "gap_p99_ms", "gap_max_ms", "ttft_p50_ms", "ttft_p99_ms"):
        if row.get(k) is not None and direct.get(k) is not None:
            out["added_" + k] = round(row[k] - direct[k], 2)
    return out


async def soak(total: int, upstream_url: str, work: Path, args) -> dict:
    """``total`` short streams, 250 at a time, through one gateway: its memory after each
    round, and the records."""
    subject = Subject("prefixgate", work, upstream_url, args)
    await subject.start()
    reqs = requests_for("prefixgate", subject.url, "fake-fast")
    samples, sent, answered = [], 0, 0
    t0 = time.monotonic()
    try:
        while sent < total:
            n = min(250, total - sent)
            lv = await sl.run_level(reqs, n, 0.05, 60)
            sent += n
            answered += lv.answered
            samples.append((sent, rss_mib(subject.pid)))
            if len(samples) % 40 == 0:
                _say(f"  soak {sent}/{total} streams, RSS {samples[-1][1]:.1f} MiB")
    finally:
        subject.stop(keep=True)
    with sqlite3.connect(subject.db) as db:
        q = "SELECT COUNT(*) FROM requests WHERE requested_model = 'fake-fast'"
        records = db.execute(q).fetchone()[0]
    tenth = samples[max(0, len(samples) // 10 - 1)][1]
    half = samples[len(samples) // 2][1]
    end = samples[-1][1]
    return {
        "streams": sent,
        "answered": answered,
        "records": records,
        "seconds": round(time.monotonic() - t0, 1),
        "rss_at_10pct_mib": round(tenth, 1),
        "rss_at_50pct_mib": round(half, 1),
        "rss_end_mib": round(end, 1),
        "rss_growth_second_half_pct": round(100 * (end - half) / half, 1),
        "samples": [(s, round(r, 1)) for s, r in samples[:: max(1, len(samples) // 20)]],
    }


async def run(args) -> dict:
    os.sched_setaffinity(0, {LOAD_CPU})
    work = Path(tempfile.mkdtemp(prefix="prefixgate-streams-"))
    loop = asyncio.get_running_loop()
    up = sl.PacedUpstream(args.chunks, args.gap)
    port = free_port()
    server = await loop.create_server(up.protocol, "127.0.0.1", port, backlog=8192)
    upstream_url = f"http://127.0.0.1:{port}"
    targets = ["direct", *(["floor-nopoll"] if args.floor else [])]
    targets += [*(["prefixgate-before"] if args.before_src else []), "prefixgate"]
    litellm = None
    if not args.no_litellm:
        litellm = _litellm_available(args.litellm_version)
        if litellm is None:
            _say("litellm is not installed here: its row is left out (overhead.py installs it)")
    result: dict = {"levels": [], "chunks": args.chunks, "gap_ms": args.gap * 1000}
    try:
        for n in args.levels:
            row: dict = {"n": n}
            for t in targets:
                _say(f"N={n}: {t}")
                row[t] = await measure(t, n, upstream_url, work, args)
            if litellm and n == 100:
                _say(f"N={n}: litellm")
                row["litellm"] = await measure("litellm", n, upstream_url, work, args)
            for t in targets[1:] + (["litellm"] if "litellm" in row else []):
                row[t].update(added(row[t], row["direct"]))
                floor = row.get("floor-nopoll", {}).get("relay_cpu_us_per_chunk")
                if floor and row[t].get("relay_cpu_us_per_chunk"):
                    row[t]["relay_vs_floor"] = round(row[t]["relay_cpu_us_per_chunk"] / floor, 2)
            result["levels"].append(row)
        if args.soak:
            _say(f"soak: {args.soak} streams")
            result["soak"] = await soak(args.soak, upstream_url, work, args)
    finally:
        server.close()
    return result


def _litellm_available(version: str) -> Path | None:
    exe = Path.home() / ".cache" / "prefixgate" / f"litellm-{version}" / "bin" / "litellm"
    return exe if exe.exists() else None


# -- the table ------------------------------------------------------------------------------
def _f(v, fmt="{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def table(result: dict) -> str:
    cols = [
        ("N", lambda r: str(r["n"])),
        ("path", lambda r: r["_path"]),
        (
            "gap p50/p99/max ms",
            lambda r: "/".join(_f(r[k]) for k in ("gap_p50_ms", "gap_p99_ms", "gap_max_ms")),
        ),
        ("added p99 ms", lambda r: _f(r.get("added_gap_p99_ms"))),
        ("TTFT p50/p99 ms", lambda r: f"{_f(r['ttft_p50_ms'])}/{_f(r['ttft_p99_ms'])}"),
        ("CPU µs/chunk", lambda r: _f(r["cpu_us_per_chunk"])),
        ("relay µs/chunk (user)", lambda r: _relay(r)),
        ("× floor", lambda r: _f(r.get("relay_vs_floor"), "{:.2f}")),
        ("CPU", lambda r: _f(r["cpu_share"], "{:.0%}")),
        ("load CPU", lambda r: _f(r["load_side_cpu_share"], "{:.0%}")),
        ("KiB/stream", lambda r: _f(r["rss_per_stream_kib"])),
        ("pause ≤ms", lambda r: _f(r["loop_pause_max_ms"])),
        ("open max", lambda r: str(r["open_max"])),
        (
            "done/refused/reset/cut/stall",
            lambda r: f"{r['completed']}/{r['refused']}/{r['reset']}/{r['cut']}/{r['stalled']}",
        ),
        ("records/answered", lambda r: f"{_f(r['records'], '{}')}/{r['answered']}"),
    ]
    rows = []
    for level in result["levels"]:
        for path in ("direct", "floor-nopoll", "prefixgate-before", "prefixgate", "litellm"):
            if path in level:
                rows.append({**level[path], "_path": path})
    cells = [[name for name, _ in cols]] + [[f(r) for _, f in cols] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    if "soak" in result:
        s = result["soak"]
        lines.append("")
        lines.append(
            f"soak: {s['streams']} streams in {s['seconds']} s, answered {s['answered']}, "
            f"records {s['records']}; RSS {s['rss_at_10pct_mib']} MiB at 10%, "
            f"{s['rss_at_50pct_mib']} at 50%, {s['rss_end_mib']} at the end "
            f"({s['rss_growth_second_half_pct']:+}% over the second half)"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="100,300,1000,2000,4000")
    ap.add_argument("--chunks", type=int, default=400)
    ap.add_argument("--gap", type=float, default=0.025, help="seconds between chunks")
    ap.add_argument("--ramp", type=float, default=5.0, help="seconds to start a level's streams")
    ap.add_argument("--soak", type=int, default=0, help="short streams for the memory soak")
    ap.add_argument("--no-litellm", action="store_true")
    ap.add_argument(
        "--floor",
        action="store_true",
        help="also the floor: a bare uvloop relay of the same streams (overhead_floor.py)",
    )
    ap.add_argument("--litellm-version", default=LITELLM_VERSION)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--set", action="append", help="a gateway setting: server.max_in_flight=500")
    ap.add_argument(
        "--before",
        metavar="GIT_REF",
        help="also the gateway as it was at this git ref (prefixgate-before), in the same run",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.levels = [int(x) for x in args.levels.split(",") if x]
    with checked_out(args.before) as tree:
        args.before_src = tree / "src" if tree is not None else None
        try:
            import uvloop

            result = uvloop.run(run(args))
        except ImportError:
            result = asyncio.run(run(args))
    print(json.dumps(result, indent=2) if args.json else table(result))


if __name__ == "__main__":
    main()
