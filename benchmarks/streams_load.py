"""The two ends of `streams.py`, in one event loop: a paced OpenAI upstream and a load
generator of long streams.

Paced upstream (:class:`PacedUpstream`): ``POST …/chat/completions`` with ``"stream":
true`` answers a role chunk and the first content chunk (``Hello``) at once, then one
content chunk every ``gap`` seconds (``chunks`` in all), then the finish, the usage and
``[DONE]``: a model decoding at 1/gap tokens a second. The chunks of every stream are
written by one timer (a tick a millisecond, each stream in the bucket of its due time),
not a task per stream, so that thousands of streams cost the upstream a write each and
little else. A JSON request gets one completion. ``GET /health`` and ``…/models`` answer
200.

Load generator (:func:`run_level`): ``n`` streams started evenly over ``ramp`` seconds,
each on a connection of its own, read by a bare asyncio protocol that keeps only what the
figures need: the status (a refusal is one with ``retry-after``), the arrival time of each
read and how many content events it held (an inter-chunk gap histogram in 0.1 ms bins;
events that arrive in one read have a gap of 0), the time to the first content event,
whether the stream ended (the chunked body's last chunk) or was cut.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from dataclasses import dataclass, field

import msgspec
from overhead_upstream import FakeUpstream, _Cache

BIN = 1e-4  # histogram bins of 0.1 ms
BINS = 200_000  # up to 20 s; longer gaps land in the last bin
STALL = 1.0  # a gap this long (or a stream unfinished at the deadline) is a stall


_encode = msgspec.json.encode
USAGE = {"prompt_tokens": 600, "completion_tokens": 400, "total_tokens": 1000}


def _chunk(delta: dict | None, finish: str | None = None, usage: dict | None = None) -> bytes:
    obj: dict = {
        "id": "chatcmpl-paced",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "fake",
        "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage:
        obj["usage"] = usage
    data = b"data: " + _encode(obj) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


class PacedUpstream:
    """The upstream's shared state: the chunks (built once) and the pacer's buckets."""

    def __init__(self, chunks: int = 400, gap: float = 0.025) -> None:
        self.gap = gap
        self.loop = asyncio.get_running_loop()
        self.first = _SSE_HEAD + _chunk({"role": "assistant", "content": ""})
        self.first += _chunk({"content": "Hello"})
        self.body = [_chunk({"content": f" w{i}"}) for i in range(1, chunks)]
        done = b"data: [DONE]\n\n"
        self.tail = (
            _chunk({}, "stop")
            + _chunk(None, usage=USAGE)
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done)
        )
        self.cache = _Cache()  # the JSON answers of overhead_upstream
        self.buckets: dict[int, list] = {}  # due millisecond -> [(conn, next index, due)]
        self.ticking = False
        self.writes = 0

    def start(self, conn: _UpConn, model: str) -> None:
        if model.endswith("-fast"):  # the whole stream at once (the soak)
            conn.transport.writelines([self.first, *self.body[:16], self.tail])
            conn.busy = False
            conn._parse()
            return
        conn.transport.write(self.first)
        self._due(conn, 0, self.loop.time() + self.gap)

    def _due(self, conn: _UpConn, i: int, due: float) -> None:
        self.buckets.setdefault(int(due * 1000), []).append((conn, i, due))
        if not self.ticking:
            self.ticking = True
            self.loop.call_later(0.001, self._tick)

    def _tick(self) -> None:
        now = self.loop.time()
        now_ms = int(now * 1000)
        buckets, body, gap = self.buckets, self.body, self.gap
        for ms in sorted(k for k in buckets if k <= now_ms):
            for conn, i, due in buckets.pop(ms):
                t = conn.transport
                if t.is_closing():
                    continue
                self.writes += 1
                if i < len(body):
                    t.write(body[i])
                    nxt = due + gap
                    buckets.setdefault(int(nxt * 1000), []).append((conn, i + 1, nxt))
                else:
                    t.write(self.tail)
                    conn.busy = False
                    conn._parse()
        if buckets:
            self.loop.call_later(0.001, self._tick)
        else:
            self.ticking = False

    def protocol(self) -> _UpConn:
        return _UpConn(self)


async def serve_paced(chunks: int, gap: float) -> tuple[asyncio.Server, str]:
    """A :class:`PacedUpstream` listening on a free loopback port, and its URL."""
    up = PacedUpstream(chunks, gap)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(up.protocol, "127.0.0.1", 0, backlog=8192)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


class _UpConn(FakeUpstream):
    """``overhead_upstream``'s request parsing; its streams go to the pacer."""

    def __init__(self, up: PacedUpstream) -> None:
        super().__init__(up.cache)
        self.up = up

    async def _send_stream(self, model: str) -> None:
        self.up.start(self, model)


# -- the load generator ----------------------------------------------------------------------
@dataclass
class Level:
    """What one level of load saw."""

    n: int
    gaps: array = field(default_factory=lambda: array("l", bytes(8 * BINS)))
    ttfts: list[float] = field(default_factory=list)
    chunks: int = 0
    completed: int = 0
    refused: int = 0  # an overloaded answer with retry-after, before any stream byte
    refused_no_retry_after: int = 0
    errors: int = 0  # any other status
    reset: int = 0  # the connection closed (or failed) before any answer
    cut: int = 0  # a stream that started and did not end
    stalled: int = 0  # a gap >= STALL, or unfinished at the deadline
    open_now: int = 0
    open_max: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0

    def gap(self, q: float) -> float | None:
        """The q-quantile of the inter-chunk gaps, in seconds (None: no gap seen)."""
        total = sum(self.gaps)
        if not total:
            return None
        want, seen = q * total, 0
        for i, c in enumerate(self.gaps):
            seen += c
            if seen >= want and c:
                return (i + 0.5) * BIN
        return None  # pragma: no cover

    def gap_max(self) -> float | None:
        for i in range(BINS - 1, -1, -1):
            if self.gaps[i]:
                return (i + 1) * BIN
        return None

    @property
    def answered(self) -> int:
        return self.completed + self.refused + self.refused_no_retry_after + self.errors + self.cut


class _Client(asyncio.Protocol):
    __slots__ = (
        "level",
        "raw",
        "transport",
        "t0",
        "last",
        "head",
        "status",
        "chunked",
        "tail",
        "done",
        "stalled",
        "future",
        "length",
        "got",
        "retry_after",
    )

    def __init__(self, level: Level, raw: bytes, future: asyncio.Future) -> None:
        self.level, self.raw, self.future = level, raw, future
        self.head = bytearray()
        self.status = 0
        self.chunked = False
        self.tail = b""
        self.done = False
        self.stalled = False
        self.last = 0.0
        self.length = -1
        self.got = 0
        self.retry_after = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.t0 = time.perf_counter()
        transport.write(self.raw)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self.status:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.head[:end]).lower()
            data = bytes(self.head[end + 4 :])
            self.status = int(head[9:12])
            self.chunked = b"transfer-encoding: chunked" in head
            self.retry_after = b"\r\nretry-after:" in head
            i = head.find(b"content-length:")
            if i >= 0:
                j = head.find(b"\r\n", i)
                self.length = int(head[i + 15 : j if j >= 0 else None])
            lv = self.level
            lv.statuses[self.status] = lv.statuses.get(self.status, 0) + 1
            if self.status == 200:
                lv.open_now += 1
                lv.open_max = max(lv.open_max, lv.open_now)
        if self.status != 200:
            self.got += len(data)
            if self.length >= 0 and self.got >= self.length:
                self._end()
            return
        # Every content event holds its text once: "Hello", then " w1", " w2", … (in any
        # JSON spelling: the gateway's compact one, LiteLLM's with spaces).
        k = data.count(b'" w') + data.count(b'"Hello"')
        if k:
            lv = self.level
            lv.chunks += k
            if self.last:
                g = now - self.last
                if g >= STALL:
                    self.stalled = True
                lv.gaps[min(int(g / BIN), BINS - 1)] += 1
            else:
                lv.ttfts.append(now - self.t0)
            if k > 1:
                lv.gaps[0] += k - 1
            self.last = now
        tail = self.tail + data
        if tail.endswith(b"\r\n0\r\n\r\n"):
            self._end()
        self.tail = tail[-8:]

    def _end(self) -> None:
        if self.done:
            return
        self.done = True
        lv = self.level
        if self.status == 200:
            lv.open_now -= 1
            lv.completed += 1
            lv.stalled += self.stalled
        elif self.status in (429, 503, 529):
            if self.retry_after:
                lv.refused += 1
            else:
                lv.refused_no_retry_after += 1
        else:
            lv.errors += 1
        self.transport.close()
        if not self.future.done():
            self.future.set_result(None)

    def connection_lost(self, exc) -> None:
        if not self.done:
            self.done = True
            lv = self.level
            if not self.status and self.stalled:  # abandoned at the deadline, unanswered
                lv.stalled += 1
            elif not self.status:
                lv.reset += 1
            elif self.status == 200:
                lv.open_now -= 1
                lv.cut += 1
                lv.stalled += 1
            else:
                lv.errors += 1
        if not self.future.done():
            self.future.set_result(None)

    def abandon(self) -> None:
        """At the deadline: a stream still open is a stall."""
        if not self.done:
            self.stalled = True
            self.transport.abort()


@dataclass(frozen=True)
class Request:
    host: str
    port: int
    raw: bytes  # the whole request


def request(url: str, path: str, body: dict, headers: dict[str, str]) -> Request:
    host, port = url.removeprefix("http://").split(":")
    data = _encode(body)
    lines = [f"POST {path} HTTP/1.1", f"host: {host}:{port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += ["content-type: application/json", f"content-length: {len(data)}"]
    return Request(host, int(port), ("\r\n".join(lines) + "\r\n\r\n").encode() + data)


async def run_level(
    requests: list[Request], n: int, ramp: float, deadline: float, progress=None
) -> Level:
    """``n`` streams, ``requests`` taken in turn, started evenly over ``ramp`` seconds;
    everything still open ``deadline`` seconds after the start is abandoned (a stall)."""
    loop = asyncio.get_running_loop()
    level = Level(n)
    clients: list[_Client] = []
    futures: list[asyncio.Future] = []
    t0 = loop.time()

    async def one(i: int) -> None:
        req = requests[i % len(requests)]
        fut = loop.create_future()
        futures.append(fut)
        await asyncio.sleep(max(0.0, t0 + ramp * i / n - loop.time()))
        try:
            _, proto = await loop.create_connection(
                lambda: _Client(level, req.raw, fut), req.host, req.port
            )
        except OSError:
            level.reset += 1
            fut.set_result(None)
            return
        clients.append(proto)

    starters = [loop.create_task(one(i)) for i in range(n)]
    start = time.perf_counter()
    end = t0 + deadline
    while loop.time() < end:
        await asyncio.sleep(0.5)
        if progress is not None:
            progress(level, loop.time() - t0)
        if all(s.done() for s in starters) and all(f.done() for f in futures):
            break
    for c in clients:
        c.abandon()
    for s in starters:
        s.cancel()
    await asyncio.sleep(0.05)
    level.seconds = time.perf_counter() - start
    return level
