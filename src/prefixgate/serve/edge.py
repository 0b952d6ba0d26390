"""The bounded edge: what a client connection may hold of the server, on both HTTP
servers the gateway runs on (its own, ``httpserver``, and uvicorn, ``uvicorn_edge``).

Why: a client that opens a connection and sends its request one byte at a time
(slowloris), or a header line that never ends, or thousands of idle connections, must not
take the file descriptors, memory or time that the other clients' requests need. So:

- a request head must be complete within ``head_timeout`` seconds of its first byte;
- a request body still arriving must not pause for ``body_timeout`` seconds, and after its
  first ``body_timeout`` seconds must average at least ``body_min_rate`` bytes/s;
- a connection idle between requests is closed after ``keepalive`` seconds;
- past ``max_connections`` open connections, a new one is answered 503 (``refusal``, an
  ASGI app: the gateway's answers in the route's error shape) once its head is read, then
  closed; past that cap by a tenth more, a new one is closed at once.

A late head or body gets ``408 Request Timeout`` and the connection closes. While the app
answers, nothing here applies: the app's own timeouts do.

The deadlines are checked by one sweep a server runs every ``tick`` seconds over its
connections, not by a timer per request: the request path only counts (a request number,
bytes read), which keeps the fast path as fast as before. A deadline is thus met within
one tick after it passes (a quarter of the shortest timeout, at most a second).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from http import HTTPStatus

log = logging.getLogger("prefixgate.http")

# What a connection is doing, as its protocol reports it (``edge_state``).
IDLE, HEAD, BODY, ANSWERING = 0, 1, 2, 3


@dataclass(frozen=True)
class EdgeLimits:
    head_timeout: float = 30.0
    body_timeout: float = 30.0
    body_min_rate: float = 1024.0  # bytes/s; 0: no floor
    keepalive: float = 5.0
    max_connections: int = 10_000

    @property
    def tick(self) -> float:
        return min(1.0, self.head_timeout / 4, self.body_timeout / 4, self.keepalive / 4)

    @property
    def hard_cap(self) -> int:
        """Past this, a connection is closed at once instead of answered 503."""
        return self.max_connections + max(16, self.max_connections // 10)


def plain(status: int, text: str) -> bytes:
    """A whole plain-text response that closes the connection: the server's own answers to
    what never reached the app (a malformed or late request)."""
    body = text.encode()
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
    return (
        f"HTTP/1.1 {status} {phrase}\r\n".encode("latin-1")
        + b"content-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
        + b"content-length: %d\r\n\r\n" % len(body)
        + body
    )


def host_error(hosts: int, http_version: str) -> str | None:
    """RFC 9112 §3.2: an HTTP/1.1 request without ``Host``, or any request with more than
    one, is answered 400. ``hosts``: how many ``Host`` headers it has."""
    if hosts > 1:
        return "more than one Host header"
    if hosts == 0 and http_version == "1.1":
        return "the Host header is required"
    return None


async def send_refusal(send, body: bytes, content_type: bytes, status: int = 503) -> None:
    """A refusal (503, or Anthropic's 529) with ``retry-after: 1`` (clients and SDKs retry
    it after a pause) and ``connection: close`` (the connection is given back at once)."""
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", b"1"),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def service_unavailable(scope, receive, send) -> None:
    """The default refusal past the connection cap: plain text."""
    if scope["type"] == "http":
        body = b"the server is at its connection limit; retry shortly"
        await send_refusal(send, body, b"text/plain; charset=utf-8")


class _Watch:
    """What the sweep last saw of one connection."""

    __slots__ = ("key", "since", "start_bytes", "bytes", "progress")

    def __init__(self, key, now: float, received: int) -> None:
        self.key = key
        self.since = self.progress = now
        self.start_bytes = self.bytes = received


class Edge:
    """One server's limits, its connections and the sweep over them. A connection's
    protocol offers ``edge_state() -> (phase, request number, bytes received)`` and
    ``edge_expire(status, text)`` (``status`` None: close quietly), and an ``edge_watch``
    attribute the sweep keeps its notes in."""

    def __init__(self, limits: EdgeLimits, refusal=None, connections: set | None = None):
        self.limits = limits
        self.refusal = refusal or service_unavailable
        self.connections: set = connections if connections is not None else set()
        self.refused = 0  # connections answered 503 or closed past the cap
        self.expired = {"head": 0, "body": 0, "idle": 0}
        self._task: asyncio.Task | None = None

    def admit(self) -> int:
        """For a new connection (already counted in ``connections``): 0 to serve it, 1 to
        answer it with ``refusal``, 2 to close it at once."""
        n = len(self.connections)
        if n <= self.limits.max_connections:
            return 0
        self.refused += 1
        if self.refused in (1, 10, 100, 1000) or self.refused % 10_000 == 0:
            log.warning(
                "at the connection limit (%d): %d connections refused so far",
                self.limits.max_connections,
                self.refused,
            )
        return 1 if n <= self.limits.hard_cap else 2

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._task = loop.create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        tick = self.limits.tick
        while True:
            await asyncio.sleep(tick)
            try:
                self.sweep(loop.time())
            except Exception:  # pragma: no cover - a bug here must not stop the sweeps
                log.exception("edge sweep failed")

    def sweep(self, now: float) -> None:
        lim = self.limits
        for conn in list(self.connections):
            phase, number, received = conn.edge_state()
            if phase == ANSWERING:
                conn.edge_watch = None
                continue
            key = (phase, number)
            w = conn.edge_watch
            if w is None or w.key != key:
                conn.edge_watch = _Watch(key, now, received)
                continue
            if received != w.bytes:
                w.bytes, w.progress = received, now
            if phase == IDLE:
                if now - w.since >= lim.keepalive:
                    self.expired["idle"] += 1
                    conn.edge_expire(None, "")
            elif phase == HEAD:
                if now - w.since >= lim.head_timeout:
                    self.expired["head"] += 1
                    conn.edge_expire(
                        408, f"the request head did not arrive within {lim.head_timeout:g} s"
                    )
            elif now - w.progress >= lim.body_timeout:
                self.expired["body"] += 1
                conn.edge_expire(
                    408, f"no byte of the request body came for {lim.body_timeout:g} s"
                )
            elif lim.body_min_rate > 0:
                late = now - w.since - lim.body_timeout
                if late > 0 and received - w.start_bytes < lim.body_min_rate * late:
                    self.expired["body"] += 1
                    conn.edge_expire(
                        408, f"the request body came slower than {lim.body_min_rate:g} bytes/s"
                    )
