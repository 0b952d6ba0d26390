"""Which HTTP client for the upstream hop: client CPU per request, in one run.

    python benchmarks/upstream_client.py [--seconds 3] [--json]

The gateway's upstream request is a POST of a ~50 KB JSON body (the Claude Code request
in Chat form), answered with JSON or a short SSE stream. This sends it, against the fast
fake upstream of ``overhead_upstream.py`` (pinned to core 1), from this process (pinned
to core 0, uvloop), with each client: httpx, aiohttp and prefixgate's own ``http1`` (via
``prefixgate.upstream.Upstream``, as the gateway uses it), reading every body to the end,
at concurrency 1 and 32. The figure is this process's CPU time per request (user +
system), which is what the client costs the gateway's event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead  # noqa: E402

from prefixgate.config import Timeouts  # noqa: E402
from prefixgate.upstream import Upstream  # noqa: E402

CLIENTS = ("httpx", "aiohttp", "http1")


async def _run(client: str, url: str, body: bytes, stream: bool, conc: int, seconds: float):
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
    if client == "httpx":
        import httpx

        http = httpx.AsyncClient(limits=httpx.Limits(max_connections=1000), timeout=30)

        async def one() -> None:
            async with http.stream("POST", url, content=body, headers=headers) as r:
                async for _ in r.aiter_raw():
                    pass

        close = http.aclose
    elif client == "aiohttp":
        import aiohttp

        http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1000, keepalive_timeout=4.0),
            auto_decompress=False,
        )

        async def one() -> None:
            async with http.post(url, data=body, headers=headers) as r:
                async for _ in r.content.iter_any():
                    pass

        close = http.close
    else:
        up = Upstream()
        t = Timeouts()

        async def one() -> None:
            r = await up.open(url, body, timeouts=t, extra_headers=headers)
            try:
                while await r.next(30) is not None:
                    pass
            finally:
                await r.aclose()

        close = up.aclose

    done = 0
    stop_at = 0.0

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            await one()
            done += 1

    stop_at = time.monotonic() + 0.3  # warm-up: connections, first-call paths
    await asyncio.gather(*(worker() for _ in range(conc)))
    done = 0
    cpu0, t0 = time.process_time(), time.monotonic()
    stop_at = t0 + seconds
    await asyncio.gather(*(worker() for _ in range(conc)))
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    await close()
    return {"requests": done, "rps": done / wall, "cpu_us_per_request": 1e6 * cpu / done}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    _, chat = overhead.bodies()
    port = overhead.free_port()
    up = subprocess.Popen(
        [sys.executable, str(overhead.HERE / "overhead_upstream.py"), "--port", str(port)],
        preexec_fn=overhead.pinned(overhead.LOAD_CPU),
    )
    os.sched_setaffinity(0, {overhead.GATEWAY_CPU})
    base = f"http://127.0.0.1:{port}"
    results: dict = {}
    try:
        overhead.wait_http(base + "/health", up)
        for stream in (False, True):
            body = {**chat, "stream": stream}
            if stream:
                body["stream_options"] = {"include_usage": True}
            raw = json.dumps(body).encode()
            for conc in (1, 32):
                case = f"{'stream' if stream else 'json'}/c{conc}"
                for client in CLIENTS:
                    print(f"{case}: {client}", file=sys.stderr)
                    results.setdefault(case, {})[client] = overhead._arun(
                        _run(client, base + "/v1/chat/completions", raw, stream, conc, args.seconds)
                    )
    finally:
        overhead.stop(up)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"{'case':<12}" + "".join(f"{c + ' µs/req':>16}" for c in CLIENTS) + f"{'rps (http1)':>14}"
    )
    for case, row in results.items():
        line = f"{case:<12}" + "".join(f"{row[c]['cpu_us_per_request']:>16.0f}" for c in CLIENTS)
        print(line + f"{row['http1']['rps']:>14.0f}")


if __name__ == "__main__":
    main()
