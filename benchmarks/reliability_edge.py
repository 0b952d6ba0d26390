"""The bounded edge's rows of the reliability benchmark (run them with ``reliability.py``),
against real ``prefixgate serve`` processes on both HTTP servers.

Placement, as in ``overhead.py``: the gateway on core 0; the fake upstream
(``overhead_upstream.py``), the load generator and the attackers on core 1. The attackers
run in a process of their own (this script with ``--attack``), so that their sockets do not
slow the load generator's loop. Latency goals are ratios to a baseline of the same run: the
same load before the attack and after it, on the same gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as ov  # noqa: E402
import overhead_load as load  # noqa: E402
import overhead_upstream as fake  # noqa: E402

IMPLS = ("prefixgate", "uvicorn")
CASES: dict[str, Callable[[argparse.Namespace], dict]] = {}
P99_RATIO_GOAL = 1.5  # what two noisy cores give between two runs of the same load
RSS_GROWTH_GOAL_MIB = 64.0
SLOWLORIS_CONNECTIONS = 2000
SLOWLORIS_GAP = 10.0  # seconds between two header bytes
CHAT = json.dumps(
    {"model": "fake", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
).encode()


def case(name: str):
    def register(fn):
        CASES[name] = fn
        return fn

    return register


def row(name: str, result: str, goal: str, met: bool, **figures) -> dict:
    return {"case": name, "result": result, "goal": goal, "met": bool(met), **figures}


# -- the processes --------------------------------------------------------------------------
def Upstream():  # noqa: N802 - a context manager, read as a thing
    return fake.Running(ov.LOAD_CPU)


class Gateway:
    """``prefixgate serve`` on core 0, its output in a file."""

    def __init__(self, work: Path, impl: str, upstream: str | None, **server):
        self.port = ov.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        channels = [{"name": "fake", "base_url": f"{upstream or 'http://127.0.0.1:1'}/v1"}]
        cfg = {
            "server": {"host": "127.0.0.1", "port": self.port, **server},
            "channels": channels,
            "store": None,
            "embedded_upstream": upstream is None,
        }
        path = work / f"gw-{impl}-{self.port}.json"
        path.write_text(json.dumps(cfg))
        self.log_path = work / f"gw-{impl}-{self.port}.log"
        self.cmd = [sys.executable, "-m", "prefixgate.cli", "serve", "--config", str(path)]
        self.cmd += ["--http", impl]

    def __enter__(self) -> Gateway:
        self.log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.cmd, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=ov.pinned(0)
        )
        ov.wait_http(self.url + "/healthz", self.proc)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def raw_status(port: int, data: bytes) -> int | None:
    """The status of the answer to ``data`` sent on a fresh connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        got = b""
        while b"\r\n" not in got:
            part = s.recv(4096)
            if not part:
                return None
            got += part
    return int(got.split(b" ", 2)[1])


# -- normal load while attacked -------------------------------------------------------------
async def _load_and_rss(url: str, pid: int, seconds: float) -> tuple[list[float], float, int]:
    """Chat requests at concurrency 1 for ``seconds``: the latencies, the gateway's peak
    RSS meanwhile (MiB) and the failed requests."""
    peak = 0.0

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, rss_mib(pid))
            await asyncio.sleep(0.5)

    sampler = asyncio.ensure_future(sample())
    try:
        res = await load.run(url + "/v1/chat/completions", CHAT, {}, concurrency=1, seconds=seconds)
    finally:
        sampler.cancel()
    return res.latencies, peak, res.errors


def rss_mib(pid: int) -> float:
    """The gateway's resident memory (one process: no walk over /proc while measuring)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def p99_ms(latencies: list[float]) -> float:
    xs = sorted(latencies)
    return 1000 * xs[min(len(xs) - 1, int(len(xs) * 0.99))] if xs else float("nan")


def attacked(args, impl: str, attack: list[str], what: str) -> dict:
    """The gateway's p99 and RSS under ``attack`` (an ``--attack`` command line), against
    the same load before and after."""
    work = Path(tempfile.mkdtemp(prefix="prefixgate-reliability-"))
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {ov.LOAD_CPU})  # the load generator beside the attackers
    try:
        return _attacked(args, impl, attack, what, work)
    finally:
        os.sched_setaffinity(0, cpus)


def _attacked(args, impl: str, attack: list[str], what: str, work: Path) -> dict:
    with Upstream() as up, Gateway(work, impl, up.url) as gw:
        pid = gw.proc.pid
        ov._arun(_load_and_rss(gw.url, pid, 1.0))  # warm-up
        before, rss_before, err0 = ov._arun(_load_and_rss(gw.url, pid, args.baseline_seconds))
        report = work / "attack.json"
        attacker = subprocess.Popen(
            [sys.executable, __file__, "--attack", *attack, "--port", str(gw.port)]
            + ["--seconds", str(args.attack_seconds), "--report", str(report)],
            preexec_fn=ov.pinned(ov.LOAD_CPU),
        )
        time.sleep(args.ramp_seconds)  # the attackers connected
        during, rss_peak, err1 = ov._arun(
            _load_and_rss(gw.url, pid, args.attack_seconds - args.ramp_seconds - 1)
        )
        attacker.wait(args.attack_seconds + 60)
        after, _, err2 = ov._arun(_load_and_rss(gw.url, pid, args.baseline_seconds))
        rss_after = rss_mib(pid)
        seen = json.loads(report.read_text())
    base = p99_ms(before + after)
    ratio = p99_ms(during) / base
    growth = rss_peak - rss_before
    errors = err0 + err1 + err2
    met = ratio <= P99_RATIO_GOAL and growth <= RSS_GROWTH_GOAL_MIB and errors == 0
    return row(
        f"{what} ({impl})",
        f"p99 {p99_ms(during):.2f} ms vs {base:.2f} ms baseline (x{ratio:.2f}); "
        f"RSS {rss_before:.0f} -> {rss_peak:.0f} MiB peak, {rss_after:.0f} after; "
        f"{errors} failed; {seen['summary']}",
        f"p99 x <= {P99_RATIO_GOAL}, RSS +<= {RSS_GROWTH_GOAL_MIB:.0f} MiB, 0 failed",
        met,
        p99_ms=p99_ms(during),
        p99_baseline_ms=base,
        p99_ratio=ratio,
        rss_before_mib=rss_before,
        rss_peak_mib=rss_peak,
        rss_after_mib=rss_after,
        failed=errors,
        attack=seen,
    )


for _impl in IMPLS:

    def _slowloris(args, impl=_impl) -> dict:
        attack = ["slowloris", "--connections", str(args.connections)]
        return attacked(args, impl, attack, f"{args.connections} slowloris connections")

    def _endless(args, impl=_impl) -> dict:
        return attacked(args, impl, ["endless"], "an endless header line")

    case(f"slowloris-{_impl}")(_slowloris)
    case(f"endless-header-{_impl}")(_endless)


# -- the attackers (a process of their own) -------------------------------------------------
async def _slowloris_attack(port: int, n: int, seconds: float) -> dict:
    """``n`` connections, each sending its head one byte every ``SLOWLORIS_GAP`` seconds,
    reconnecting when the server closes it."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    held: list[float] = []  # how long the server kept each connection
    statuses: dict[str, int] = {}

    async def one(i: int) -> None:
        await asyncio.sleep(i * 2.0 / n)  # connect over two seconds
        while loop.time() < end:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                statuses["connect failed"] = statuses.get("connect failed", 0) + 1
                await asyncio.sleep(1)
                continue
            t0 = loop.time()
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            answer = b""
            while loop.time() < end:
                try:
                    answer = await asyncio.wait_for(reader.read(4096), SLOWLORIS_GAP)
                    break
                except TimeoutError:
                    writer.write(b"a")
                except (OSError, RuntimeError):
                    break
            if loop.time() < end:
                held.append(loop.time() - t0)
                status = answer[9:12].decode() if answer[:5] == b"HTTP/" else "closed"
                statuses[status] = statuses.get(status, 0) + 1
            writer.close()

    await asyncio.gather(*(one(i) for i in range(n)))
    summary = f"{n} held; ended by the server: {sum(statuses.values())}"
    if held:
        summary += f" ({', '.join(f'{k}: {v}' for k, v in sorted(statuses.items()))}),"
        summary += f" each held {min(held):.0f}-{max(held):.0f} s"
    return {"summary": summary, "statuses": statuses, "held_max_s": max(held, default=0)}


async def _endless_attack(port: int, seconds: float) -> dict:
    """One header line that never ends, at up to 16 MB/s; a new one when refused."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    refused, most = 0, 0
    piece = b"a" * 65536
    while loop.time() < end:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        sent = 0
        try:
            while loop.time() < end:
                writer.write(piece)
                await writer.drain()
                sent += len(piece)
                await asyncio.sleep(0.004)
                if reader.at_eof():
                    break
        except (OSError, RuntimeError):  # reset; uvloop: written after the close
            pass
        if loop.time() < end:
            refused += 1
            most = max(most, sent)
        writer.close()
    return {
        "summary": f"{refused} endless lines refused, each after <= {most / 2**20:.1f} MiB sent",
        "refused": refused,
        "most_sent_bytes": most,
    }


def attack_main(args) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.attack == "slowloris":
        out = ov._arun(_slowloris_attack(args.port, args.connections, args.seconds))
    else:
        out = ov._arun(_endless_attack(args.port, args.seconds))
    Path(args.report).write_text(json.dumps(out))


# -- the edge's other rows ------------------------------------------------------------------
@case("host-rules")
def host_rules(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="prefixgate-reliability-"))
    got = {}
    for impl in IMPLS:
        with Gateway(work, impl, None) as gw:
            got[impl] = (
                raw_status(gw.port, b"GET /healthz HTTP/1.1\r\n\r\n"),
                raw_status(gw.port, b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
            )
    result = "; ".join(f"{impl}: no Host {a}, two Hosts {b}" for impl, (a, b) in got.items())
    met = all(v == (400, 400) for v in got.values())
    return row("no Host / two Host headers", result, "400 / 400 on both servers", met)


@case("connection-cap")
def connection_cap(args) -> dict:
    """Past ``server.max_connections``, the route's overloaded answer (529 on
    ``/v1/messages``, as admission's); served again once the connections held are gone."""
    work = Path(tempfile.mkdtemp(prefix="prefixgate-reliability-"))
    cap, out = 100, {}
    messages = json.dumps({"model": "fake", "max_tokens": 8, "messages": []}).encode()
    post = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
    for impl in IMPLS:
        with Upstream() as up, Gateway(work, impl, up.url, max_connections=cap) as gw:
            held = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(cap)]
            time.sleep(0.5)  # all accepted
            with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
                s.sendall(post % (len(messages), messages))
                answer = b""
                while part := s.recv(65536):
                    answer += part
            for h in held:
                h.close()
            time.sleep(0.5)
            again = raw_status(gw.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _, body = answer.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1]) if head else None
        shape = json.loads(body).get("error", {}).get("type") if body else None
        out[impl] = (status, shape, b"retry-after: 1" in head.lower(), again)
    result = "; ".join(
        f"{impl}: {s} {shape}{' retry-after' if ra else ''}, then {again}"
        for impl, (s, shape, ra, again) in out.items()
    )
    met = all(v == (529, "overloaded_error", True, 200) for v in out.values())
    return row(
        f"connection {cap + 1} past a cap of {cap}",
        result,
        "529 overloaded_error with retry-after, closed; 200 once below the cap",
        met,
    )


@case("port-in-use")
def port_in_use(args) -> dict:
    out = {}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for impl in IMPLS:
            r = subprocess.run(
                [sys.executable, "-m", "prefixgate.cli", "serve", "--port", str(port)]
                + ["--http", impl],
                capture_output=True,
                text=True,
                timeout=60,
            )
            errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
            out[impl] = (len(errors), r.stderr.count("Traceback"), r.returncode)
    result = "; ".join(
        f"{impl}: {n} error line, {tb} tracebacks, exit {rc}" for impl, (n, tb, rc) in out.items()
    )
    met = all(n == 1 and tb == 0 and rc == 1 for n, tb, rc in out.values())
    return row("port already in use", result, "1 line, no traceback, exit 1", met)


@case("sigterm")
def sigterm(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="prefixgate-reliability-"))
    out = {}
    for impl in IMPLS:
        with Gateway(work, impl, None) as gw:  # the embedded upstream, as `serve` alone
            ov._arun(_load_and_rss(gw.url, gw.proc.pid, 1.0))
            before = len(gw.output.splitlines())
            rc = gw.stop(signal.SIGTERM)
            after = gw.output.splitlines()[before:]
            out[impl] = (rc, len(after), sum("Traceback" in line for line in after))
    result = "; ".join(
        f"{impl}: exit {rc}, {n} lines after the signal, {tb} tracebacks"
        for impl, (rc, n, tb) in out.items()
    )
    met = all(rc == 0 and n <= 1 and tb == 0 for rc, n, tb in out.values())
    return row("SIGTERM on serve", result, "exit 0, at most 1 line, no traceback", met)


@case("busy-poll-default")
def busy_poll_default(args) -> dict:
    from prefixgate.config import parse_config

    cfg = parse_config({"channels": [{"name": "a", "base_url": "http://127.0.0.1:1/v1"}]})
    us = cfg.server.busy_poll_us
    return row(
        "busy polling by default",
        f"server.busy_poll_us = {us:g} ({'off' if us == 0 else 'on'}); opt-in figures: "
        "benchmarks/busypoll.py",
        "0 (off)",
        us == 0,
    )


# -- the table ------------------------------------------------------------------------------
def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--connections", type=int, default=SLOWLORIS_CONNECTIONS)
    ap.add_argument("--baseline-seconds", type=float, default=10.0)
    ap.add_argument(
        "--attack-seconds",
        type=float,
        default=50.0,
        help="past the 30 s head deadline, so that every slowloris connection is ended once",
    )
    ap.add_argument("--ramp-seconds", type=float, default=4.0)


def _attacker() -> None:
    """The attackers' own process (``attacked`` starts this file with ``--attack``)."""
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    ap.add_argument("--attack", choices=["slowloris", "endless"], required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--report", required=True)
    attack_main(ap.parse_args())


if __name__ == "__main__":
    _attacker()
