"""The load generator of `overhead.py`: raw asyncio streams on uvloop, one keep-alive
HTTP/1.1 connection per concurrent client, request bytes built once.

It costs a few tens of microseconds of CPU a request (no HTTP client library, no JSON
decoding of the answers), so at concurrency 32 it is far from being the bottleneck of
the gateways measured; for the direct path it shares a core with the fake upstream, and
that pair is the bottleneck there (direct throughput is a reference, not a goal).

Each request is timed from the first byte written to the end of the response (latency)
and to the first body bytes holding the first content token, ``Hello`` (time to first
token, for streams; equal to latency otherwise).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

MARK = b"Hello"


@dataclass
class Result:
    latencies: list[float] = field(default_factory=list)  # seconds
    ttfts: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0  # the measured window

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0


def build_request(url: str, body: bytes, headers: dict[str, str]) -> tuple[str, int, bytes]:
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    lines = [f"POST {u.path} HTTP/1.1", f"host: {host}:{port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += ["content-type: application/json", f"content-length: {len(body)}"]
    return host, port, ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class _Conn:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def ensure(self) -> None:
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(
                self.host, self.port, limit=1 << 22
            )

    def drop(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, raw: bytes) -> tuple[float, float]:
        """Send one request, read the whole answer; (latency, ttft) in seconds."""
        await self.ensure()
        r, w = self.reader, self.writer
        t0 = time.perf_counter()
        w.write(raw)
        head = await r.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        ttft = 0.0
        close = b"connection: close" in lower
        if b"transfer-encoding: chunked" in lower:
            tail = b""
            while True:
                size = int((await r.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
                data = await r.readexactly(size + 2)
                if not ttft and MARK in tail + data:
                    ttft = time.perf_counter() - t0
                tail = data[-8:]
                if size == 0:
                    break
        else:
            i = lower.find(b"content-length:")
            if i >= 0:
                n = int(lower[i + 15 : lower.find(b"\r\n", i)])
                data = await r.readexactly(n)
            else:  # read to close
                data = await r.read()
                close = True
            if MARK in data:
                ttft = time.perf_counter() - t0
        t1 = time.perf_counter()
        if close:
            self.drop()
        if status != 200:
            raise RuntimeError(f"status {status}")
        return t1 - t0, ttft or (t1 - t0)


async def run(
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    concurrency: int,
    seconds: float,
    warmup: float = 0.5,
) -> Result:
    host, port, raw = build_request(url, body, headers)
    res = Result()
    loop = asyncio.get_running_loop()
    start = loop.time()
    t_begin = start + warmup
    t_end = t_begin + seconds

    async def client() -> None:
        conn = _Conn(host, port)
        while True:
            now = loop.time()
            if now >= t_end:
                break
            try:
                lat, ttft = await conn.request(raw)
            except (OSError, asyncio.IncompleteReadError, RuntimeError, ValueError):
                res.errors += 1
                conn.drop()
                await asyncio.sleep(0.01)
                continue
            # Every request answered after the warm-up counts, the last one of each client
            # too (it started before the window's end): a starved machine still measures.
            if loop.time() >= t_begin:
                res.latencies.append(lat)
                res.ttfts.append(ttft)
        conn.drop()

    await asyncio.gather(*(client() for _ in range(concurrency)))
    res.seconds = seconds
    return res
