"""Operating the gateway under load: what a config reload and an upgrade cost the streams
in flight (docs/operating.md).

    python benchmarks/operate.py [--streams 200] [--chunks 240] [--gap 0.05]
                                 [--reload-every 1.0] [--arrivals 32] [--json]

Three paced upstreams (``streams_load.py``: SSE chunks ``--gap`` apart, ``--chunks`` in
all, so a 12-second stream by default) and the load generator run in this process; the
gateway is a real ``prefixgate serve`` process (SQLite store, ``server.loop_watch`` on),
loopback only.

**Reload.** ``--streams`` streams (half ``/v1/messages``, half chat) started over two
seconds, twice in the same gateway: once with no reload (``quiet``), once while the config
is rewritten and the gateway sent ``SIGHUP`` every ``--reload-every`` seconds, each time
swapping a replica (A+B <-> B+C) and the input price (1 <-> 10 a million tokens). Figures
per phase: streams completed / reset / cut / stalled, the inter-chunk gap p50 / p99 /
max as the clients saw them (the ratio of the reload phase's p99 to the quiet phase's is
what reloading cost the streams, measured in one run), and per reload the seconds the
gateway took to swap (its own figure, ``last_reload.seconds``) and from the signal until
``/healthz?details`` named the new generation (a 10 ms poll: an upper bound).

**Upgrade.** ``--streams`` streams open on an old process; a new process starts on the
same port (``SO_REUSEPORT``); once it serves (its ``--pid-file``), the old one gets
SIGTERM while ``--arrivals`` loops send short requests on a new connection each. Figures:
streams dropped (reset, cut or stalled), new requests answered and failed, the seconds
from SIGTERM until the old process let go of the port and until it exited (and its exit
status), and records in the store against requests answered (each once).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import streams_load as sl
import yaml
from streams import requests_for

ROOT = Path(__file__).resolve().parent.parent


def _say(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def _config(work: Path, port: int, replicas: list[str], price: float) -> dict:
    return {
        "server": {"port": port, "max_connections": 5000, "loop_watch": True, "drain_timeout": 120},
        "channels": [
            {
                "name": "paced",
                "base_url": replicas[0] + "/v1",
                "replicas": [r + "/v1" for r in replicas[1:]],
                "routing": {"policy": "round_robin"},
                "render_order": "tools_first",
            }
        ],
        "prices": {
            "models": {},
            "channels": {"paced": {"input": price, "cached_input": 0.1, "output": 2}},
        },
        "store": {"dsn": f"sqlite:///{work / 'records.db'}", "journal_path": str(work / "journal")},
    }


class Gateway:
    def __init__(self, work: Path, name: str, config: dict) -> None:
        self.path = work / f"{name}.yaml"
        self.path.write_text(yaml.safe_dump(config))
        self.pid_file = work / f"{name}.pid"
        self.log = work / f"{name}.log"
        self._out = open(self.log, "wb")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prefixgate.cli", "serve", "--config", str(self.path),
             "--pid-file", str(self.pid_file)],
            cwd=work, stdout=self._out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{config['server']['port']}"

    async def ready(self) -> None:
        while not self.pid_file.exists():
            if self.proc.poll() is not None:
                raise SystemExit(f"the gateway exited: {self.log.read_text()}")
            await asyncio.sleep(0.05)

    def rewrite(self, config: dict) -> None:
        self.path.write_text(yaml.safe_dump(config))

    async def wait(self) -> int:
        while self.proc.poll() is None:
            await asyncio.sleep(0.05)
        self._out.close()
        return self.proc.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")


async def _state(client: httpx.AsyncClient, url: str) -> dict:
    r = await client.get(url + "/healthz?details")
    return r.json()["details"]["config"]


def _level(lv: sl.Level) -> dict:
    q = {k: lv.gap(p) for k, p in (("p50", 0.5), ("p99", 0.99))}
    return {
        "streams": lv.n,
        "completed": lv.completed,
        "reset": lv.reset,
        "cut": lv.cut,
        "stalled": lv.stalled,
        "errors": lv.errors + lv.refused + lv.refused_no_retry_after,
        "gap_p50_ms": q["p50"] and q["p50"] * 1000,
        "gap_p99_ms": q["p99"] and q["p99"] * 1000,
        "gap_max_ms": (lv.gap_max() or 0) * 1000,
    }


async def reload_phase(args, work: Path, ups: list[str], port: int) -> dict:
    configs = [_config(work, port, ups[:2], 1.0), _config(work, port, ups[1:], 10.0)]
    gw = Gateway(work, "reload", configs[0])
    await gw.ready()
    reqs = requests_for("gateway", gw.url)
    deadline = args.chunks * args.gap + 30
    _say("reload: quiet phase")
    quiet = await sl.run_level(reqs, args.streams, 2.0, deadline)
    _say("reload: reloading phase")
    swaps, seen = [], []
    async with httpx.AsyncClient(timeout=10) as client:
        level = asyncio.ensure_future(sl.run_level(reqs, args.streams, 2.0, deadline))
        generation = (await _state(client, gw.url))["generation"]
        turn = 1
        while not level.done():
            await asyncio.sleep(args.reload_every)
            if level.done():
                break
            gw.rewrite(configs[turn % 2])
            t0 = time.perf_counter()
            gw.proc.send_signal(signal.SIGHUP)
            while (state := await _state(client, gw.url))["generation"] == generation:
                await asyncio.sleep(0.01)
            seen.append(time.perf_counter() - t0)
            generation = state["generation"]
            assert state["last_reload"]["applied"], state
            swaps.append(state["last_reload"]["seconds"])
            turn += 1
        reloading = await level
    gw.proc.send_signal(signal.SIGTERM)
    status = await gw.wait()
    q, r = _level(quiet), _level(reloading)
    return {
        "quiet": q,
        "reloading": r,
        "reloads": len(swaps),
        "swap_ms_median": statistics.median(swaps) * 1000 if swaps else None,
        "swap_ms_max": max(swaps) * 1000 if swaps else None,
        "signal_to_serving_ms_median": statistics.median(seen) * 1000 if seen else None,
        "signal_to_serving_ms_max": max(seen) * 1000 if seen else None,
        "gap_p99_ratio": (r["gap_p99_ms"] / q["gap_p99_ms"]) if q["gap_p99_ms"] else None,
        "exit_status": status,
    }


async def _arrivals(url: str, stop: asyncio.Event, loops: int) -> tuple[list[str], list[str]]:
    ids, errors = [], []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def loop() -> None:
            while not stop.is_set():
                try:
                    r = await client.post(url + "/v1/chat/completions", json=body)
                    if r.status_code == 200:
                        ids.append(r.headers["x-request-id"])
                    else:
                        errors.append(str(r.status_code))
                except httpx.HTTPError as exc:
                    errors.append(repr(exc))

        await asyncio.gather(*(loop() for _ in range(loops)))
    return ids, errors


async def upgrade_phase(args, work: Path, ups: list[str], port: int) -> dict:
    cfg = _config(work, port, ups[:2], 1.0)
    old = Gateway(work, "old", cfg)
    await old.ready()
    reqs = requests_for("gateway", old.url)
    streams = asyncio.ensure_future(
        sl.run_level(reqs, args.streams, 2.0, args.chunks * args.gap + 60)
    )
    await asyncio.sleep(3.0)  # every stream started (over 2 s) on the old process
    stop = asyncio.Event()
    arrivals = asyncio.ensure_future(_arrivals(old.url, stop, args.arrivals))
    new = Gateway(work, "new", cfg)
    await new.ready()
    await asyncio.sleep(0.5)
    t0 = time.perf_counter()
    old.proc.send_signal(signal.SIGTERM)
    while "no longer accepting" not in old.output():
        await asyncio.sleep(0.01)
    let_go = time.perf_counter() - t0
    await asyncio.sleep(1.0)
    stop.set()
    ids, errors = await arrivals
    level = await streams
    old_status = await old.wait()
    exited = time.perf_counter() - t0
    new.proc.send_signal(signal.SIGTERM)
    new_status = await new.wait()
    lv = _level(level)
    import sqlite3

    with sqlite3.connect(work / "records.db") as db:
        rows = db.execute("SELECT request_id FROM requests").fetchall()
    recorded = [r[0] for r in rows]
    return {
        "streams": lv,
        "streams_dropped": lv["reset"] + lv["cut"] + lv["stalled"] + lv["errors"],
        "new_requests_answered": len(ids),
        "new_requests_failed": len(errors),
        "failures": errors[:5],
        "let_go_s": let_go,
        "old_exit_s": exited,
        "old_exit_status": old_status,
        "new_exit_status": new_status,
        "records": len(recorded),
        "records_duplicated": len(recorded) - len(set(recorded)),
        "answered_without_record": len(set(ids) - set(recorded)),
    }


async def run(args) -> dict:
    servers, ups = [], []
    for _ in range(3):
        server, url = await sl.serve_paced(args.chunks, args.gap)
        servers.append(server)
        ups.append(url)
    out = {"args": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "reload").mkdir()
        (work / "upgrade").mkdir()
        out["reload"] = await reload_phase(args, work / "reload", ups, _free_port())
        out["upgrade"] = await upgrade_phase(args, work / "upgrade", ups, _free_port())
    for s in servers:
        s.close()
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def table(result: dict) -> str:
    r, u = result["reload"], result["upgrade"]
    lines = ["| reload | quiet | reloading |", "| --- | --- | --- |"]
    for key in (
        "completed",
        "reset",
        "cut",
        "stalled",
        "errors",
        "gap_p50_ms",
        "gap_p99_ms",
        "gap_max_ms",
    ):
        a, b = r["quiet"][key], r["reloading"][key]
        fmt = (lambda v: f"{v:.1f}") if key.startswith("gap") else str
        lines.append(f"| {key} | {fmt(a)} | {fmt(b)} |")
    lines += [
        "",
        f"reloads: {r['reloads']}; swap on the loop: median {r['swap_ms_median']:.2f} ms, "
        f"max {r['swap_ms_max']:.2f} ms; signal to serving: median "
        f"{r['signal_to_serving_ms_median']:.1f} ms, max {r['signal_to_serving_ms_max']:.1f} ms; "
        f"gap p99 reloading / quiet: {r['gap_p99_ratio']:.2f}",
        "",
        f"upgrade: streams {u['streams']['completed']}/{u['streams']['streams']} completed, "
        f"dropped {u['streams_dropped']}; new requests answered {u['new_requests_answered']}, "
        f"failed {u['new_requests_failed']}; the old process let go after {u['let_go_s']:.2f} s "
        f"and exited {u['old_exit_status']} after {u['old_exit_s']:.1f} s; records "
        f"{u['records']} (duplicated {u['records_duplicated']}, answered without a record "
        f"{u['answered_without_record']})",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=200)
    p.add_argument("--chunks", type=int, default=240)
    p.add_argument("--gap", type=float, default=0.05)
    p.add_argument("--reload-every", type=float, default=1.0)
    p.add_argument("--arrivals", type=int, default=32)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    os.environ.setdefault("PYTHONPATH", str(ROOT / "src"))
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2) if args.json else table(result))


if __name__ == "__main__":
    main()
