"""A minimal, fast fake OpenAI upstream for `overhead.py`: raw asyncio protocol on uvloop.

    python benchmarks/overhead_upstream.py --port 9100

``POST …/chat/completions`` answers at once, with usage:
- ``"stream": false``: one JSON chat completion (content-length, keep-alive);
- ``"stream": true``: a short SSE stream (role, 4 content chunks, finish, usage, [DONE]),
  chunked, each event its own write; a model whose name ends in ``-long`` gets 256
  content chunks (the per-chunk relay cost), one ending in ``-slow`` 64 chunks 50 ms apart
  (a stream that trickles, as a model decoding does).
The first content text is always ``Hello``: the load generator times the first token by it.
``GET /health`` and ``GET /v1/models`` answer 200. Anything else is 404.

The request body is decoded with msgspec into a two-field struct (the rest skipped), so
its cost is the same for every path measured.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

import msgspec


class _Req(msgspec.Struct):
    model: str = "fake"
    stream: bool = False


_decode_req = msgspec.json.Decoder(_Req).decode
_encode = msgspec.json.encode

SLOW_GAP = 0.05  # seconds between the events of a ``-slow`` stream

USAGE = {
    "prompt_tokens": 12000,
    "completion_tokens": 5,
    "total_tokens": 12005,
    "prompt_tokens_details": {"cached_tokens": 11520},
}


def _completion(model: str) -> bytes:
    return _encode(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 1700000000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hello from the fake upstream."},
                    "finish_reason": "stop",
                }
            ],
            "usage": USAGE,
        }
    )


def _chunk(model: str, delta: dict, finish: str | None = None, usage: dict | None = None):
    obj: dict = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": model,
        "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage:
        obj["usage"] = usage
    data = b"data: " + _encode(obj) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _stream(model: str, n: int) -> list[bytes]:
    words = ["Hello"] + [f" w{i}" for i in range(1, n)]
    parts = [_chunk(model, {"role": "assistant", "content": ""})]
    parts += [_chunk(model, {"content": w}) for w in words]
    parts.append(_chunk(model, {}, "stop"))
    parts.append(_chunk(model, {}, usage={**USAGE, "completion_tokens": n}))
    done = b"data: [DONE]\n\n"
    parts.append(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
    return parts


_JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
_NOT_FOUND = (
    b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
)
_MODELS = b'{"object":"list","data":[{"id":"fake","object":"model"}]}'
_OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(_MODELS),
    _MODELS,
)


class _Cache:
    """Responses built once per model name."""

    def __init__(self) -> None:
        self.once: dict[str, bytes] = {}
        self.streams: dict[str, list[bytes]] = {}

    def completion(self, model: str) -> bytes:
        r = self.once.get(model)
        if r is None:
            body = _completion(model)
            r = self.once[model] = _JSON_HEAD % len(body) + body
        return r

    def stream(self, model: str) -> list[bytes]:
        r = self.streams.get(model)
        if r is None:
            n = 256 if model.endswith("-long") else 64 if model.endswith("-slow") else 4
            r = self.streams[model] = _stream(model, n)
        return r


class FakeUpstream(asyncio.Protocol):
    def __init__(self, cache: _Cache) -> None:
        self.cache = cache
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._parse()

    def _parse(self) -> None:
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end])
            length = 0
            lower = head.lower()
            i = lower.find(b"content-length:")
            if i >= 0:
                j = lower.find(b"\r\n", i)
                length = int(lower[i + 15 : j if j >= 0 else None])
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4 : end + 4 + length])
            del self.buf[: end + 4 + length]
            method, path = head.split(b" ", 2)[:2]
            if method == b"POST" and path.endswith(b"/chat/completions"):
                req = _decode_req(body)
                if req.stream:
                    self.busy = True
                    asyncio.get_running_loop().create_task(self._send_stream(req.model))
                    return
                self.transport.write(self.cache.completion(req.model))
            elif method == b"GET" and (path.endswith(b"/models") or path == b"/health"):
                self.transport.write(_OK)
            else:
                self.transport.write(_NOT_FOUND)

    async def _send_stream(self, model: str) -> None:
        t = self.transport
        t.write(_SSE_HEAD)
        gap = SLOW_GAP if model.endswith("-slow") else 0
        for part in self.cache.stream(model):
            if t.is_closing():
                return
            t.write(part)
            await asyncio.sleep(gap)  # each event its own write, as a real server sends them
        self.busy = False
        self._parse()


class Running:
    """This server in a process of its own, pinned to ``cpu``, for the benchmarks that
    measure against it: ``with Running(cpu) as up: up.url``."""

    def __init__(self, cpu: int | None = None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.cpu = cpu

    def __enter__(self) -> Running:
        cmd = [sys.executable, __file__, "--port", str(self.port)]
        if self.cpu is not None:
            cmd += ["--cpu", str(self.cpu)]
        self.proc = subprocess.Popen(cmd)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.proc.kill()
                    raise SystemExit("the fake upstream did not start") from None
                time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def serve(host: str, port: int) -> None:
    cache = _Cache()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FakeUpstream(cache), host, port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--cpu", type=int, default=None, help="pin to this core")
    args = ap.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    try:
        import uvloop

        uvloop.run(serve(args.host, args.port))
    except ImportError:
        asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
