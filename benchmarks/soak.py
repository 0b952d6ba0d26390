"""Soak: steady load through the real gateway process to the simulated upstream.

    python benchmarks/soak.py --minutes 30 [--rps 20] [--json]

Starts `prefixgate upstream-sim` and `prefixgate serve` (SQLite store, an API key) as
separate processes, sends a steady mix of /v1/messages and /v1/chat/completions requests,
streaming and not, and samples the gateway's resident memory. At the end it stops the
gateway with SIGTERM and checks: errors (must be 0), records in the store == requests
sent (exact), resident memory growth after warm-up (goal < 10%), and whether the API key
or the upstream key appears in the gateway's log or its store (must not).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import wait_http  # noqa: E402

KEY = "pg-soak-" + "k" * 24
UPSTREAM_KEY = "sk-upstream-soak-SECRET-123456"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def load(url: str, seconds: float, rps: float, stats: dict) -> None:
    rng = random.Random(0)
    headers = {"x-api-key": KEY}
    history = [{"role": "user", "content": "Read the build log and fix the failing test."}]
    async with httpx.AsyncClient(base_url=url, timeout=60, headers=headers) as client:

        async def one(i: int) -> None:
            kind = i % 4
            try:
                if kind < 2:
                    body = {
                        "model": "soak",
                        "max_tokens": 64,
                        "system": [
                            {
                                "type": "text",
                                "text": f"x-anthropic-billing-header: cc_version=1.0.0.abc; cch={i:05x};",
                            },
                            {"type": "text", "text": "You are a coding agent. " * 50},
                        ],
                        "messages": history[: 1 + (i % 9)],
                        "stream": kind == 1,
                        "metadata": {"user_id": json.dumps({"session_id": f"s{i % 16}"})},
                    }
                    r = await client.post("/v1/messages", json=body)
                    ok = r.status_code == 200 and (kind == 0 or "message_stop" in r.text)
                else:
                    body = {
                        "model": "soak",
                        "messages": [
                            {"role": "system", "content": "Stable agent. " * 40},
                            *history[: 1 + (i % 7)],
                        ],
                        "stream": kind == 3,
                        "user": f"u{i % 16}",
                    }
                    r = await client.post("/v1/chat/completions", json=body)
                    ok = r.status_code == 200 and (kind == 2 or "[DONE]" in r.text)
            except httpx.HTTPError:
                ok = False
            stats["sent"] += 1
            if not ok:
                stats["errors"] += 1

        for i in range(40):  # a little history to grow into
            history.append(
                {
                    "role": "assistant" if i % 2 == 0 else "user",
                    "content": f"step {i} " * rng.randint(5, 60),
                }
            )
        tasks = set()
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < seconds:
            t = asyncio.create_task(one(i))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            i += 1
            await asyncio.sleep(rng.expovariate(rps))
        await asyncio.gather(*tasks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--rps", type=float, default=20)
    ap.add_argument(
        "--warmup", type=float, default=0.1, help="share of the run before the memory baseline"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="prefixgate-soak-"))
    bin_dir = Path(sys.executable).parent
    up_port, gw_port = free_port(), free_port()
    upstream = subprocess.Popen(
        [
            str(bin_dir / "prefixgate"),
            "upstream-sim",
            "--port",
            str(up_port),
            "--block-size",
            "64",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    config = {
        "server": {"host": "127.0.0.1", "port": gw_port},
        "channels": [
            {
                "name": "sim",
                "base_url": f"http://127.0.0.1:{up_port}/v1",
                "api_key_env": "SOAK_UPSTREAM_KEY",
            }
        ],
        "keys": [{"name": "soak", "key_sha256": hashlib.sha256(KEY.encode()).hexdigest()}],
        "store": {"dsn": f"sqlite:///{work}/soak.db", "journal_path": str(work / "journal")},
    }
    (work / "gw.json").write_text(json.dumps(config))  # YAML is a superset of JSON
    log = open(work / "gateway.log", "wb")  # noqa: SIM115 (outlives this block)
    gateway = subprocess.Popen(
        [str(bin_dir / "prefixgate"), "serve", "--config", str(work / "gw.json")],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "SOAK_UPSTREAM_KEY": UPSTREAM_KEY},
    )
    url = f"http://127.0.0.1:{gw_port}"
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health", upstream)
        wait_http(url + "/healthz", gateway)
        stats = {"sent": 0, "errors": 0}
        samples: list[tuple[float, float]] = []
        seconds = args.minutes * 60

        async def sample() -> None:
            t0 = time.monotonic()
            while True:
                samples.append((time.monotonic() - t0, rss_mib(gateway.pid)))
                if sys.stderr.isatty():
                    print(
                        f"\r{samples[-1][0]:7.0f} s  sent {stats['sent']:7d}  errors {stats['errors']}  rss {samples[-1][1]:.1f} MiB",
                        end="",
                        file=sys.stderr,
                    )
                await asyncio.sleep(5)

        async def run() -> None:
            sampler = asyncio.create_task(sample())
            await load(url, seconds, args.rps, stats)
            sampler.cancel()

        asyncio.run(run())
        gateway.send_signal(signal.SIGTERM)
        rc = gateway.wait(60)
    finally:
        for p in (gateway, upstream):
            if p.poll() is None:
                p.kill()
        log.close()
    with sqlite3.connect(work / "soak.db") as db:
        records = db.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
        store_dump = "\n".join(str(r) for r in db.execute("SELECT * FROM requests LIMIT 2000"))
    log_text = (work / "gateway.log").read_text(errors="replace")
    warm = [m for t, m in samples if t >= seconds * args.warmup] or [m for _, m in samples]
    base, peak, last = warm[0], max(warm), warm[-1]
    result = {
        "minutes": args.minutes,
        "rps_target": args.rps,
        "requests": stats["sent"],
        "errors": stats["errors"],
        "records": records,
        "records_lost": stats["sent"] - records,
        "exit_code": rc,
        "rss_after_warmup_mib": round(base, 1),
        "rss_peak_mib": round(peak, 1),
        "rss_end_mib": round(last, 1),
        "rss_growth_pct": round(100 * (last - base) / base, 1) if base else None,
        "keys_leaked": sum(
            k in text for k in (KEY, UPSTREAM_KEY) for text in (log_text, store_dump)
        ),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print()
        width = max(len(k) for k in result)
        for k, v in result.items():
            print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    main()
