"""The gateway's HTTP/1.1 server: an ASGI server on asyncio protocols and httptools'
request parser, made for this gateway's traffic (docs/performance.md says why it
replaced uvicorn for the gateway, with the figures).

What it does:

- HTTP/1.1 keep-alive (idle connections closed after ``keepalive`` seconds), pipelined
  requests answered in order, HTTP/1.0, ``HEAD``, ``Expect: 100-continue``;
- request bodies are buffered before the app runs, up to ``max_body`` bytes: past it
  (declared or received) the app runs at once with what came, so that it answers 413 in
  its own shape, and the connection closes after the answer;
- responses with ``content-length`` or chunked (close-delimited for HTTP/1.0), write
  flow control (a slow reader pauses the app's ``send``);
- ASGI 3, spec 2.4: ``send`` raises :class:`OSError` once the client is gone; and the
  request's task is cancelled when the client disconnects mid-request, so that a
  streaming relay stops, and its upstream request is cancelled, at once rather than at
  the next chunk;
- the ASGI lifespan (startup before listening, shutdown after the drain);
- graceful stop: ``should_exit`` (or SIGTERM/SIGINT, from the main thread) stops
  accepting, closes idle connections, lets requests in flight finish for up to
  ``graceful`` seconds, then cancels what is left.

Header lines past ``max_header_bytes`` in all get 431 here (the app may set a lower,
route-shaped limit of its own); a request target past 64 KiB gets 414; a malformed request,
an HTTP/1.1 one without ``Host`` or any with two, gets 400 and the connection is closed. An
``Upgrade`` (websocket, h2c) is not taken: the request is answered in HTTP/1.1. A request
head or body still arriving has a deadline, idle connections are closed, and past a number
of connections new ones are refused (``edge.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import logging
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from urllib.parse import unquote

import httptools

from prefixgate import busypoll
from prefixgate.chunked import SIZE_LINES
from prefixgate.serve import handover
from prefixgate.serve.edge import ANSWERING, BODY, HEAD, IDLE, Edge, EdgeLimits, host_error, plain

log = logging.getLogger("prefixgate.http")

_MAX_TARGET = 64 * 1024
# A stop hands the port over (``_hand_over``): it keeps accepting until its accept queues
# stayed empty this long (a handshake under way when the steering began lands here), at
# most ``HANDOVER_MAX`` seconds.
HANDOVER_QUIET = 0.5
HANDOVER_MAX = 3.0
DRAIN_IDLE_GRACE = 1.0

# The listen backlog: as deep as the kernel allows (it caps it at net.core.somaxconn, 4096
# on current Linux). Connections of a burst wait there until the accept loop takes them,
# and are then answered (at worst overloaded, by admission), instead of being reset.
BACKLOG = 65535
_PIPELINE_PAUSE = 16  # queued requests on one connection before reading pauses

_STATUS_LINES = {
    s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode("latin-1") for s in HTTPStatus
}


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = f"HTTP/1.1 {status} \r\n".encode("latin-1")
    return line


class _Date:
    """The ``date`` header, formatted once a second."""

    value = b""
    second = -1

    @classmethod
    def header(cls) -> bytes:
        now = int(time.time())
        if now != cls.second:
            cls.second = now
            cls.value = b"date: " + email.utils.formatdate(now, usegmt=True).encode() + b"\r\n"
        return cls.value


class _Request:
    """One request on a connection: its scope, buffered body and ASGI channels."""

    __slots__ = (
        "framed",
        "conn",
        "scope",
        "body",
        "body_size",
        "complete",
        "too_large",
        "keep_alive",
        "task",
        "started",
        "chunked",
        "head_only",
        "response_done",
        "disconnected",
        "body_sent",
        "waiter",
        "expect_continue",
        "head",
    )

    def __init__(self, conn: HTTPProtocol, scope: dict, keep_alive: bool) -> None:
        self.conn = conn
        self.scope = scope
        self.body: list[bytes] = []
        self.body_size = 0
        self.complete = False
        self.too_large = False
        self.keep_alive = keep_alive
        self.task: asyncio.Task | None = None
        self.started = False
        self.chunked = False
        self.head_only = scope["method"] == "HEAD"
        self.response_done = False
        self.disconnected = False
        self.body_sent = False
        self.waiter: asyncio.Future | None = None
        self.expect_continue = False
        self.head = b""  # the response head, written with the first body bytes
        self.framed = False  # the head is out, the body chunked and not yet ended

    # -- ASGI channels -----------------------------------------------------------------
    async def receive(self) -> dict:
        if not self.body_sent:
            self.body_sent = True
            body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
            self.body = []
            return {"type": "http.request", "body": body, "more_body": False}
        if not (self.disconnected or self.response_done):
            self.waiter = self.conn.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        conn = self.conn
        if self.disconnected:
            raise OSError("the client disconnected")
        if conn.write_paused:
            await conn.drain()
            if self.disconnected:
                raise OSError("the client disconnected")
        kind = message["type"]
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected http.response.start, got {kind!r}")
            self.start(message["status"], message.get("headers", ()))
            return
        if kind != "http.response.body":
            raise RuntimeError(f"expected http.response.body, got {kind!r}")
        if self.response_done:
            raise RuntimeError("the response is already complete")
        self.write_body(message.get("body", b""), message.get("more_body", False))

    # -- the splice extension (pipeline/splice.py) ---------------------------------------
    # A relay that reads its upstream through this project's own client writes the body
    # from the upstream connection's data callback, through these two methods, instead of
    # one ``send`` (and one task wake-up) per chunk. Same framing, same bookkeeping.
    def start(self, status: int, headers) -> None:
        """The response head (written with the first body bytes). A head refused (a header
        that would inject another) leaves the response not started: the server answers
        500 in its place."""
        self._start(status, headers)
        self.started = True

    def write_body(self, body: bytes, more: bool) -> None:
        """Body bytes; ``more=False`` ends the response. Dropped once the client is gone."""
        if self.response_done:
            return
        conn = self.conn
        head, self.head = self.head, b""
        if self.head_only:
            data = b""
        elif self.chunked:
            n = len(body)
            if n:
                size = SIZE_LINES[n] if n < 4096 else b"%x\r\n" % n
                data = b"".join((size, body, b"\r\n"))
            else:
                data = b""
            if not more:
                data += b"0\r\n\r\n"
        else:
            data = body
        if head or data:
            conn.write(head + data if head else data)  # the head goes with the first body bytes
        self.framed = more and self.chunked and not self.head_only
        if not more:
            self.response_done = True
            self._wake()
            conn.request_done(self)

    def _start(self, status: int, headers) -> None:
        lines = [_status_line(status), _Date.header()]
        length = close_sent = False
        for name, value in headers:
            low = name.lower()
            if low == b"content-length":
                length = True
            elif low == b"connection":
                if b"close" in value.lower():
                    self.keep_alive = False
                    close_sent = True
            elif low == b"transfer-encoding":
                continue  # the framing is this server's
            line = b"%s: %s\r\n" % (name, value)
            # its only CR and LF its end (``find``: CPython 3.11's ``bytes in bytes``
            # first tries the operand as an integer, a TypeError formatted and dropped)
            if line.find(b"\r") != len(line) - 2 or line.find(b"\n") != len(line) - 1:
                raise RuntimeError("invalid character in a response header")
            lines.append(line)
        bodiless = self.head_only or status in (204, 304) or 100 <= status < 200
        if not length and not bodiless:
            if self.scope["http_version"] == "1.0":
                self.keep_alive = False  # the body ends with the connection
            else:
                self.chunked = True
                lines.append(b"transfer-encoding: chunked\r\n")
        if not self.keep_alive:
            if not close_sent:
                lines.append(b"connection: close\r\n")
        elif self.scope["http_version"] == "1.0":
            lines.append(b"connection: keep-alive\r\n")
        lines.append(b"\r\n")
        self.head = b"".join(lines)

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


class HTTPProtocol(asyncio.Protocol):
    """One client connection."""

    # Slots, those a stream's every write touches first: at a thousand streams each write
    # finds this object gone from the CPU's caches (docs/performance.md).
    __slots__ = (
        "closed",
        "transport",
        "write_paused",
        "on_resume",
        "on_pause",
        "poller",
        "current",
        "server",
        "loop",
        "app",
        "parser",
        "parsing",
        "pipeline",
        "read_paused",
        "_drain",
        "requests",
        "_url",
        "_headers",
        "_header_bytes",
        "_in_head",
        "_head_read",
        "client",
        "sockname",
        "edge_watch",  # the edge sweep's notes
    )

    def __init__(self, server: Server) -> None:
        self.edge_watch = None
        self.server = server
        self.loop = server.loop
        self.poller = server.poller  # busypoll.py; None: off
        self.app = server.app
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.current: _Request | None = None  # the request being answered
        self.parsing: _Request | None = None  # the request being received
        self.pipeline: deque[_Request] = deque()
        self.write_paused = False
        self.read_paused = False
        self._drain: asyncio.Future | None = None
        self.on_resume: Callable[[], None] | None = None  # a splice's, while it is paused
        # A splice's, while it writes to the transport itself: told when writing pauses
        # and when the connection is closed or lost (pipeline/splice.py, its lane).
        self.on_pause: Callable[[], None] | None = None
        self.closed = False
        self.requests = 0  # requests begun on this connection
        self._url = bytearray()
        self._headers: list[tuple[bytes, bytes]] = []
        self._header_bytes = 0
        self._in_head = False  # between a request's first byte and the end of its headers
        self._head_read = 0
        self.client: tuple | None = None
        self.sockname: tuple | None = None

    # -- connection --------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.server.connections.add(self)
        peer = transport.get_extra_info("peername")
        self.client = tuple(peer[:2]) if isinstance(peer, tuple) else None
        sock = transport.get_extra_info("sockname")
        self.sockname = tuple(sock[:2]) if isinstance(sock, tuple) else None
        verdict = self.server.edge.admit()
        if verdict == 1:  # past the connection cap: answered by the refusal, then closed
            self.app = self.server.edge.refusal
        elif verdict == 2:
            self.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.on_pause is not None:
            self.on_pause()
        self.server.connections.discard(self)
        for req in (self.current, self.parsing, *self.pipeline):
            if req is None:
                continue
            req.disconnected = True
            req._wake()
            task = req.task
            if task is not None and not task.done() and not req.response_done:
                task.cancel()
        self.pipeline.clear()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        # The parser and this protocol refer to each other: left to the cyclic collector
        # (a high threshold here, process.GC_THRESHOLD), a refused endless header line's
        # megabyte in the parser's buffer outlived its connection for many connections.
        self.parser = None

    def eof_received(self) -> bool:
        return False  # a half-closed client is a gone client: close

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.on_pause is not None:
            self.on_pause()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        if self.on_resume is not None:
            self.on_resume()

    async def drain(self) -> None:
        if self.write_paused and not self.closed:
            self._drain = self.loop.create_future()
            await self._drain

    def write(self, data: bytes) -> None:
        if not self.closed:
            if (poller := self.poller) is not None:
                poller.touch()
            self.transport.write(data)

    def write_chunk(self, body: bytes) -> bool:
        """One chunk (not empty) of the chunked body of the response being written, its
        head out (the request's ``framed``): what a splice writes for each upstream read,
        straight to this connection (``pipeline/splice.py``). The same bytes as the
        request's ``write_body(body, True)``, with less on the way: the poller was touched
        by the read this answers (``busypoll``). Returns whether writing is paused (the
        client's buffer past its high-water mark)."""
        if not self.closed:
            n = len(body)
            self.transport.write(
                b"".join((SIZE_LINES[n] if n < 4096 else b"%x\r\n" % n, body, b"\r\n"))
            )
        return self.write_paused

    def write_framed(self, chunk: bytes) -> bool:
        """One chunk already framed as :meth:`write_chunk` frames one (its size line
        ``SIZE_LINES``' for its size, its CRLF): a spliced read that the relay passed on as
        it came. Returns whether writing is paused."""
        if not self.closed:
            self.transport.write(chunk)
        return self.write_paused

    def writelines(self, parts) -> None:
        if not self.closed:
            if (poller := self.poller) is not None:
                poller.touch()
            self.transport.writelines(parts)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()
            if self.on_pause is not None:
                self.on_pause()  # (a splice's lane writes no more)

    # -- the edge sweep (edge.py) -------------------------------------------------------
    def edge_state(self) -> tuple[int, int, int]:
        if self.current is not None or self.read_paused:
            return ANSWERING, self.requests, 0
        if self._in_head:
            return HEAD, self.requests, 0
        req = self.parsing
        if req is not None:
            return BODY, self.requests, req.body_size
        return IDLE, self.requests, 0

    def edge_expire(self, status: int | None, text: str) -> None:
        if status is not None and self.current is None:
            self.write(plain(status, text))
        self.close()

    @property
    def idle(self) -> bool:
        """No request on it: none answered, none arriving, none waiting."""
        return self.current is None and self.parsing is None and not self.pipeline

    def shutdown(self) -> None:
        """Server stopping: close now if idle, else after the request in flight."""
        if self.idle:
            self.close()
        else:
            for req in (self.current, self.parsing, *self.pipeline):
                if req is not None:
                    req.keep_alive = False

    # -- reading -----------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if (poller := self.poller) is not None:
            poller.touch()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            # Upgrades (websocket, h2c) are not taken: the request was answered in
            # HTTP/1.1, as a server may do, and what follows is HTTP/1.1 again.
            offset = exc.args[0] if exc.args and isinstance(exc.args[0], int) else len(data)
            self.parser = httptools.HttpRequestParser(self)
            if offset < len(data) and not self.closed:
                self.data_received(data[offset:])
            return
        except httptools.HttpParserError as exc:
            self._refuse(400, f"malformed HTTP request: {exc}")
            return
        # A header line that never ends is buffered by the parser, not shown to on_header:
        # the bytes read while in the head are counted here too.
        if self._in_head:
            self._head_read += len(data)
            if self._head_read > self.server.max_header_bytes + _MAX_TARGET:
                self._refuse(431, "request headers are too large")

    def _refuse(self, status: int, text: str) -> None:
        if self.current is None:
            self.write(plain(status, text))
        self.close()

    def on_message_begin(self) -> None:
        self.requests += 1
        self._url = bytearray()
        self._headers = []
        self._header_bytes = 0
        self._in_head = True
        self._head_read = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > _MAX_TARGET:
            self._refuse(414, "the request target is too long")
            raise httptools.HttpParserCallbackError("target too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > self.server.max_header_bytes:
            self._refuse(431, "request headers are too large")
            raise httptools.HttpParserCallbackError("headers too large")
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self.parser
        server = self.server
        url = bytes(self._url)
        q = url.find(b"?")
        raw_path, query = (url, b"") if q < 0 else (url[:q], url[q + 1 :])
        if raw_path[:1] != b"/":  # absolute-form or asterisk-form
            try:
                raw_path = httptools.parse_url(url).path or b"/"
            except httptools.HttpParserInvalidURLError:
                raw_path = b"/"
        path = raw_path.decode("latin-1")
        if "%" in path:
            path = unquote(path)
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": parser.get_http_version(),
            "server": self.sockname,
            "client": self.client,
            "scheme": "http",
            "method": parser.get_method().decode("ascii"),
            "root_path": "",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "headers": self._headers,
            "state": dict(server.state),
        }
        req = _Request(self, scope, parser.should_keep_alive() and not server.stopping)
        scope["extensions"] = {"prefixgate.splice": req}
        hosts = 0
        for name, value in self._headers:
            if name == b"content-length":
                if value.isdigit() and int(value) > server.max_body:
                    req.too_large = True
            elif name == b"host":
                hosts += 1
            elif name == b"expect" and value.lower() == b"100-continue":
                req.expect_continue = True
        if hosts != 1:
            problem = host_error(hosts, scope["http_version"])
            if problem is not None:
                self._refuse(400, problem)
                raise httptools.HttpParserCallbackError(problem)
        self.parsing = req
        if req.too_large:
            self._overflow(req)
        if req.expect_continue and not req.too_large and self.current is None:
            req.expect_continue = False
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the body is read before the app runs

    def on_body(self, body: bytes) -> None:
        req = self.parsing
        if req is None or req.too_large:
            return
        req.body.append(body)
        req.body_size += len(body)
        if req.body_size > self.server.max_body:
            self._overflow(req)

    def _overflow(self, req: _Request) -> None:
        """Past the body limit: the app answers now (413 in its own shape) and the rest of
        the body is not read."""
        req.too_large = True
        req.keep_alive = False
        req.expect_continue = False
        self.parsing = None
        self._queue(req)

    def on_message_complete(self) -> None:
        req = self.parsing
        if req is None:  # answered early (too large)
            return
        self.parsing = None
        req.complete = True
        self._queue(req)

    def _queue(self, req: _Request) -> None:
        if self.current is None:
            self._run(req)
        else:
            self.pipeline.append(req)
            if len(self.pipeline) >= _PIPELINE_PAUSE and not self.read_paused:
                self.read_paused = True
                self.transport.pause_reading()

    # -- answering ---------------------------------------------------------------------
    def _run(self, req: _Request) -> None:
        self.current = req
        req.task = self.loop.create_task(self._answer(req))

    async def _answer(self, req: _Request) -> None:
        try:
            await self.app(req.scope, req.receive, req.send)
        except asyncio.CancelledError:
            if not req.disconnected:  # the server's shutdown, not the client
                if not req.response_done:
                    self.close()
                raise
        except OSError:
            if not req.disconnected:
                log.exception("error in the ASGI app")
                if not req.response_done:
                    self.close()
        except Exception:
            log.exception("error in the ASGI app")
            if not req.response_done:  # else: after the answer (a background task)
                if (not req.started or req.head) and not self.closed:
                    # Nothing of the answer was written yet (the head waits for the body).
                    self.write(plain(500, "Internal Server Error"))
                self.close()
        else:
            if not req.response_done and not self.closed:
                if not req.started:
                    log.error("the ASGI app returned without a response")
                    self.write(plain(500, "Internal Server Error"))
                self.close()  # an unfinished response cannot be framed any more
        finally:
            # No reference cycles left to the collector: the task (its coroutine holds the
            # request) and the splice extension (the scope holds the request).
            req.task = None
            req.scope.pop("extensions", None)
            if self.current is req and (self.closed or not req.response_done):
                self.current = None

    def request_done(self, req: _Request) -> None:
        """The response is complete: next request, keep-alive or close."""
        if self.current is not req:
            return
        self.current = None
        if not req.keep_alive:
            self.close()
            return
        if self.pipeline:
            self._run(self.pipeline.popleft())
        else:
            if self.read_paused:
                self.read_paused = False
                self.transport.resume_reading()
            parsing = self.parsing
            if parsing is not None and parsing.expect_continue and not parsing.too_large:
                # Waiting for its 100 Continue, held while the previous answer went out.
                parsing.expect_continue = False
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")


class Server:
    """An ASGI app served on given sockets: ``await Server(app).serve([sock])``;
    ``should_exit = True`` stops it gracefully. ``edge``: the client side's bounds (its
    ``keepalive`` overrides theirs); ``refusal``: the ASGI app that answers past the
    connection cap."""

    def __init__(
        self,
        app,
        *,
        graceful: float = 5.0,
        keepalive: float | None = None,
        max_body: int = 64 * 1024 * 1024,
        max_header_bytes: int = 1024 * 1024,
        lifespan: bool = True,
        on_started: Callable[[], None] | None = None,
        busy_poll_us: float = 0.0,
        busy_poll_share: float = 0.5,
        edge: EdgeLimits | None = None,
        refusal=None,
        handover: tuple[int, int | None] | None = None,
    ) -> None:
        self.app = app
        # Before it stops listening: this process's sockets in the port's group and its
        # successor's (serve/handover.py); None: close at once.
        self.handover = handover
        edge = edge or EdgeLimits()
        if keepalive is not None:
            edge = dataclasses.replace(edge, keepalive=keepalive)
        self.busy_poll_us = busy_poll_us  # busypoll.py; 0: off
        self.busy_poll_share = busy_poll_share
        self.graceful = graceful
        self.max_body = max_body
        self.max_header_bytes = max_header_bytes
        self.lifespan = lifespan
        self.on_started = on_started
        self.state: dict = {}
        self.connections: set[HTTPProtocol] = set()
        self.edge = Edge(edge, refusal, self.connections)
        self.started = False
        self.should_exit = False
        self.stopping = False  # answers from now on close their connection
        self.loop: asyncio.AbstractEventLoop | None = None
        self.poller: busypoll.BusyPoll | None = None  # while serving, if it busy-polls
        self._servers: list[asyncio.AbstractServer] = []
        self._listening: list = []

    async def serve(self, sockets) -> None:
        self.loop = asyncio.get_running_loop()
        self.poller = busypoll.poller_for(self.loop, self.busy_poll_us, self.busy_poll_share)
        # the upstream client's connections, opened from this server's requests, find it
        active = busypoll.ACTIVE.set(self.poller)
        with self._signals():
            life = _Lifespan(self.app, self.state) if self.lifespan else None
            if life is not None and not await life.startup():
                raise SystemExit(3)
            try:
                self._listening = list(sockets)
                for sock in sockets:
                    self._servers.append(
                        await self.loop.create_server(
                            lambda: HTTPProtocol(self), sock=sock, backlog=BACKLOG
                        )
                    )
                self.edge.start(self.loop)
                self.started = True
                if self.on_started is not None:
                    self.on_started()
                while not self.should_exit:
                    await asyncio.sleep(0.1)
                await self._drain()
            finally:
                await self.edge.stop()
                if life is not None:
                    await life.shutdown()
                busypoll.ACTIVE.reset(active)
                self.poller = None

    async def _drain(self) -> None:
        self.stopping = True
        await self._hand_over()
        log.info(
            "stopping: no longer accepting; %d connections drain (at most %g s)",
            len(self.connections),
            self.graceful,
        )
        for s in self._servers:
            s.close()
        for sock in self._listening:  # the loop may hold a copy; this one must go too
            sock.close()
        start = self.loop.time()
        deadline = start + self.graceful
        if self.handover is None:
            for conn in list(self.connections):
                conn.shutdown()
        # Handing over, an idle kept-alive connection stays open while requests are in
        # flight here (at least DRAIN_IDLE_GRACE): a request a client sends on it is
        # answered, with `connection: close`, instead of racing the close.
        while self.connections and self.loop.time() < deadline:
            waited = self.loop.time() - start >= DRAIN_IDLE_GRACE
            if self.handover is not None and waited and all(c.idle for c in self.connections):
                break
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            req = conn.current
            if req is not None and req.task is not None:
                req.task.cancel()
            conn.close()
        for s in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(s.wait_closed(), 1.0)

    async def _hand_over(self) -> None:
        """Steer the port's new connections to a successor (``handover.py``) and keep
        accepting until this process's accept queues have stayed empty for
        ``HANDOVER_QUIET`` seconds (at most ``HANDOVER_MAX``): what the kernel queued
        here before the steering, or while a handshake was under way, is served here."""
        socks = [
            s
            for s in self._listening
            if s.fileno() >= 0 and s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
        ]
        if self.handover is None or not socks:
            return
        ours, theirs = self.handover
        if not all([handover.steer_to_successor(s, ours, theirs) for s in socks]):
            return
        loop = self.loop
        start = quiet = loop.time()
        while loop.time() - start < HANDOVER_MAX:
            await asyncio.sleep(0.02)
            if any(handover.queued(s) for s in socks):
                quiet = loop.time()
            elif loop.time() - quiet >= HANDOVER_QUIET:
                break

    @contextlib.contextmanager
    def _signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = self.loop
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal)
                installed.append(sig)
            except (NotImplementedError, RuntimeError):  # pragma: no cover
                pass
        try:
            yield
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    def _on_signal(self) -> None:
        if self.should_exit:  # a second signal: stop waiting for the drain
            self.graceful = 0
        self.should_exit = True


class _Lifespan:
    """The ASGI lifespan protocol: startup before serving, shutdown after."""

    def __init__(self, app, state: dict) -> None:
        self.app = app
        self.state = state
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.events: dict[str, asyncio.Future] = {}
        self.task: asyncio.Task | None = None
        self.supported = True

    async def startup(self) -> bool:
        loop = asyncio.get_running_loop()
        self.events = {
            k: loop.create_future()
            for k in ("startup.complete", "startup.failed", "shutdown.complete", "shutdown.failed")
        }
        scope = {
            "type": "lifespan",
            "asgi": {"version": "3.0", "spec_version": "2.0"},
            "state": self.state,
        }
        self.task = loop.create_task(self._run(scope))
        await self.inbox.put({"type": "lifespan.startup"})
        done, _ = await asyncio.wait(
            [self.task, self.events["startup.complete"], self.events["startup.failed"]],
            return_when=asyncio.FIRST_COMPLETED,
        )
        if self.events["startup.failed"].done():
            log.error("application startup failed: %s", self.events["startup.failed"].result())
            return False
        if self.events["startup.complete"].done():
            return True
        # The app returned (or raised) without answering: it has no lifespan.
        self.supported = False
        return True

    async def _run(self, scope: dict) -> None:
        try:
            await self.app(scope, self.inbox.get, self._send)
        except BaseException as exc:
            if not self.events["startup.complete"].done():
                self.supported = False
                if not isinstance(exc, Exception):
                    raise
                log.debug("the app has no lifespan: %r", exc)
            else:
                log.exception("error in the app's lifespan")

    async def _send(self, message: dict) -> None:
        kind = message["type"].removeprefix("lifespan.")
        fut = self.events.get(kind)
        if fut is not None and not fut.done():
            fut.set_result(message.get("message", ""))

    async def shutdown(self) -> None:
        if not self.supported or self.task is None or self.task.done():
            return
        await self.inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait(
            [self.task, self.events["shutdown.complete"], self.events["shutdown.failed"]],
            return_when=asyncio.FIRST_COMPLETED,
        )
        if self.events["shutdown.failed"].done():
            log.error("application shutdown failed: %s", self.events["shutdown.failed"].result())
