"""The upstream hop's HTTP/1.1 client: a pool of keep-alive connections, each an asyncio
protocol around httptools' response parser (the C parser uvicorn uses).

The gateway sends exactly one kind of request upstream (a POST with a JSON body, answered
with JSON or an SSE stream), so the client is small: no redirects, cookies, proxies,
decompression or multipart. What it does: per-origin keep-alive pools whose idle
connections a timer closes (before the upstream's own keep-alive would), a cap on open
connections in all and per origin, TLS, bounded buffering (reading pauses past 1 MiB unread),
timeouts through a single timer per wait, and one retry, on a fresh connection, of a
request whose reused connection turned out to be closed before any response byte (the
server shut it while idle). Measured against aiohttp and httpx in ``docs/performance.md``.

A stream spliced into a client's response (``pipeline/splice.py``) takes each read's body
inside ``data_received``; a read that is one whole chunk, while the parser sits between
two, is framed by the connection itself and not parsed (``tests/upstream/
test_chunk_reads.py`` holds it to what the parser makes of the same bytes).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import socket
import ssl
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

import httptools

from prefixgate import busypoll
from prefixgate.chunked import READ_LINES

_PAUSE_AT = 1 << 20  # stop reading from the socket past this many unread body bytes
_READS = len(READ_LINES)
_RESUME_AT = 1 << 18


class HTTPError(Exception):
    """A connection-level failure (the message says what happened)."""


class ConnectionClosed(HTTPError):
    """The server closed the connection before the response was complete."""

    def __init__(self, message: str, *, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response


class Origin:
    """Where requests go: scheme, host and port, and the bytes of the ``Host`` header."""

    __slots__ = (
        "key",
        "scheme",
        "host",
        "port",
        "host_header",
        "tls",
        "ssl_context",
        "limit",
        "keepalive",
    )

    def __init__(
        self,
        scheme: str,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        group: str | None = None,
    ) -> None:
        self.scheme, self.host, self.port = scheme, host, port
        self.tls = scheme == "https"
        # A channel's own TLS settings (CA bundle, client certificate): its connections are
        # kept apart from other channels' to the same host.
        self.ssl_context = ssl_context if self.tls else None
        self.key = (scheme, host, port)
        if self.ssl_context is not None:
            self.key += (id(self.ssl_context),)
        # A group (a channel's name) has connections of its own, counted against its own
        # cap: two channels on one upstream do not share (or override) each other's.
        if group is not None:
            self.key += ("group", group)
        default = 443 if self.tls else 80
        name = f"[{host}]" if ":" in host else host
        self.host_header = name if port == default else f"{name}:{port}"
        # Open connections to this origin and seconds an idle one is kept (None: the pool's).
        self.limit: int | None = None
        self.keepalive: float | None = None


def split_url(
    url: str, ssl_context: ssl.SSLContext | None = None, group: str | None = None
) -> tuple[Origin, str]:
    """(origin, path with query) of an ``http://`` or ``https://`` URL; ``group``: whose
    connections (see :class:`Origin`)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Origin(parts.scheme, parts.hostname, port, ssl_context, group), path


_TIMER_SLACK = 0.001  # a timer may run this early (the loop's clock resolution)


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class Sink(Protocol):
    """Who takes a response's body inside the connection's callbacks (a splice): at the
    end of each read (``flush``) it takes the body bytes the read brought from the
    connection's ``chunks``; a read that is one whole chunk is handed to it as it is
    (``feed``: see :meth:`Connection.data_received`)."""

    def news(self) -> None: ...  # the connection completed or failed

    def flush(self) -> None: ...  # the end of one read

    # One read's body bytes, its chunk framed here; ``framed``: the read as it came (its
    # size line the one the gateway's server writes for that many bytes).
    def feed(self, data: bytes, framed: bytes | None = None) -> None: ...


class Connection(asyncio.Protocol):
    """One keep-alive connection; carries one request/response at a time."""

    # Slots, those a stream's every read touches first: at a thousand streams each read
    # finds this object gone from the CPU's caches (docs/performance.md).
    __slots__ = (
        "poller",
        "got_bytes",
        "sink",
        "between",
        "parser",
        "paused",
        "complete",
        "error",
        "closed",
        "transport",
        "pool",
        "origin",
        "loop",
        "waiter",
        "counted",
        "idle_since",
        "reused",
        "deadline",
        "timer",
        "timer_at",
        "status",
        "headers",
        "chunks",
        "buffered",
        "headers_done",
        "keep_alive",
        "interim",
        "chunked",
        "on_body",
        "marks",
        "on_chunk_header",
        "on_chunk_complete",
    )

    def __init__(self, pool: Pool, origin: Origin) -> None:
        self.pool, self.origin = pool, origin
        self.loop = pool.loop
        # the poller of the server whose request opens it (busypoll.py); None: off
        self.poller = busypoll.current()
        self.transport: asyncio.Transport | None = None
        # The body bytes parsed and not yet taken. The parser appends to it itself (its
        # ``on_body`` is the deque's own ``append``: no Python call per HTTP chunk); what a
        # read brought is handed on once the read is parsed (``data_received``).
        self.chunks: collections.deque[bytes] = collections.deque()
        self.on_body = self.chunks.append
        # Whether a chunk has begun since the last one ended (a mark each): the parser's
        # chunk callbacks, C calls too (see data_received).
        self.marks: collections.deque[None] = collections.deque()
        self.on_chunk_header = functools.partial(self.marks.append, None)
        self.on_chunk_complete = self.marks.clear
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future | None = None
        self.closed = False  # the transport is gone (or going)
        self.counted = True  # holds one of the pool's connection slots
        self.idle_since = 0.0
        self.reused = False
        self.paused = False
        # One timer for the waits of a stream, re-armed only when it lapses: a chunk every
        # few ms costs no timer of its own (see :meth:`wait`).
        self.deadline = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        # A splice (pipeline/splice.py) takes the body as it is parsed, inside
        # data_received, instead of a reader woken per chunk.
        self.sink: Sink | None = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunks.clear()
        self.marks.clear()
        self.buffered = 0
        self.chunked = False  # the body is chunked (and nothing else)
        self.between = False  # the parser sits between two chunks of a chunked body
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False
        self.interim = False
        self.error: HTTPError | None = None

    # -- asyncio protocol --------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if (poller := self.poller) is not None:
            poller.touch()
        self.got_bytes = True
        sink = self.sink
        if self.between and sink is not None:
            # A spliced stream's read is most often one whole chunk (an engine writes each
            # event as one), and its parser sits between two: such a read is framed here
            # and its data handed on, without the parser. Taken only when it is exactly
            # what the parser would take the same way: the size of the chunk the read's
            # length leaves (1 to 4,095 bytes, so never the last chunk: READ_LINES) as its
            # size line, lower-case hex with no leading zero, sign, space or extension;
            # that many bytes; CRLF. The parser is left between two chunks, as it would be.
            n = len(data)
            if n < _READS and (line := READ_LINES[n]) is not None:
                k = len(line)
                if data[:k] == line and data[-2:] == b"\r\n":
                    sink.feed(data[k:-2], data)
                    return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(HTTPError("the upstream switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(HTTPError(f"malformed HTTP response from the upstream: {exc}"))
        # Between two chunks: no chunk begun since the last ended (or none yet, the head
        # just read), and the read ended at the end of one (not inside a size line).
        self.between = (
            self.chunked
            and not self.marks
            and data.endswith(b"\r\n")
            and not self.complete
            and self.error is None
        )
        if sink is not None:
            sink.flush()  # what this read brought leaves in one write
        elif self.chunks:
            # (its framing counted with it: a bound on what is held, not an exact count)
            self.buffered += len(data)
            if self.buffered > _PAUSE_AT:
                self.hold(True)
            self._wake()

    def eof_received(self) -> bool:
        self._ended(None)
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        self.closed = True
        self._ended(exc)
        self.pool._lost(self)
        self.parser = None  # it holds this protocol's methods: no cycle left to the collector

    # -- httptools callbacks -----------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self.headers.get(key)
        self.headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # 100 Continue and friends: the real answer follows
            self.interim = True
            self.headers = {}
            return
        self.status = status
        self.headers_done = True
        self.chunked = self.headers.get("transfer-encoding", "").strip().lower() == "chunked"
        self._wake()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        # Asked now: once this callback returns, the parser has moved on to the next message.
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True
        self._wake()

    # -- state -------------------------------------------------------------------------
    def _wake(self) -> None:
        if self.sink is not None:
            self.sink.news()  # the end, or an error
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def attach(self, sink: Sink) -> None:
        """Hand the rest of the body to ``sink`` read by read (what is buffered first: it
        is in ``chunks``); its ``news`` is told of the end or an error. No timer runs for it."""
        self._stop_timer()
        self.buffered = 0
        self.hold(False)
        self.sink = sink
        if self.complete or self.error is not None:
            sink.news()
        sink.flush()

    def detach(self) -> None:
        self.sink = None
        self.hold(False)

    def hold(self, on: bool) -> None:
        """Stop (or resume) reading from the upstream: its consumer cannot keep up (past
        ``_PAUSE_AT`` unread bytes, or a splice's client slow to read)."""
        if on != self.paused and self.transport is not None and not self.closed:
            self.paused = on
            if on:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def _fail(self, err: HTTPError) -> None:
        if self.error is None and not self.complete:
            self.error = err
        self.close()
        self._wake()

    def _ended(self, exc: Exception | None) -> None:
        if self.complete or self.error is not None:
            return
        if not self.headers_done:
            how = f"{type(exc).__name__}" if exc else "closed"
            self.error = ConnectionClosed(
                f"the upstream closed the connection ({how}) before answering",
                before_response=not self.got_bytes,
            )
        elif self._close_delimited():
            self.complete = True  # a body that ends with the connection
        else:
            how = f"{type(exc).__name__}" if exc else "closed"
            self.error = ConnectionClosed(
                f"the upstream connection {how} mid-response", before_response=False
            )
        self._wake()

    def _close_delimited(self) -> bool:
        h = self.headers
        return (
            "content-length" not in h
            and "chunked" not in h.get("transfer-encoding", "").lower()
            and self.status not in (204, 304)
        )

    def reusable(self) -> bool:
        return self.complete and not self.closed and self.error is None and self.keep_alive

    def close(self) -> None:
        self._stop_timer()
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    def abort(self) -> None:
        """Close at once: a broken or unfinished connection (a TLS one does not wait out a
        shutdown its peer may never answer, as after refusing our certificate)."""
        self._stop_timer()
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # -- request / response ------------------------------------------------------------
    def send(self, *parts: bytes) -> None:
        """Send a request: its head and body as separate buffers (one vectored write on
        uvloop, no copy of the body into one with the head)."""
        self._reset()
        if (poller := self.poller) is not None:
            poller.touch()
        if len(parts) == 1:
            self.transport.write(parts[0])
        else:
            self.transport.writelines(parts)

    async def wait(self, timeout: float) -> None:
        """Until the parser has news (headers, body bytes, the end, an error); raises
        :class:`TimeoutError` after ``timeout`` seconds."""
        loop = self.loop
        w = self.waiter = loop.create_future()
        self.deadline = deadline = loop.time() + max(timeout, 0.0)
        if self.timer is None or self.timer_at > deadline:
            if self.timer is not None:
                self.timer.cancel()
            self.timer_at = deadline
            self.timer = loop.call_at(deadline, self._check_deadline)
        try:
            await w
        finally:
            self.waiter = None

    def _check_deadline(self) -> None:
        """The timer lapsed: a wait past its deadline times out; one that began later is
        timed again, at its own deadline; with no wait the timer is gone until the next."""
        self.timer = None
        w = self.waiter
        if w is None or w.done():
            return
        if self.loop.time() + _TIMER_SLACK >= self.deadline:
            w.set_exception(TimeoutError())
        else:
            self.timer_at = self.deadline
            self.timer = self.loop.call_at(self.deadline, self._check_deadline)

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    async def headers_of_response(self, timeout: float) -> None:
        deadline = self.loop.time() + timeout
        while not self.headers_done:
            if self.error is not None:
                raise self.error
            await self.wait(deadline - self.loop.time())

    def take(self) -> bytes:
        """Every body byte buffered so far (at least one chunk must be there)."""
        chunks = self.chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        if len(chunks) > 1:
            chunks.clear()
        self.buffered = 0
        self.hold(False)
        return data

    async def read(self, timeout: float) -> bytes | None:
        """The next body bytes, ``None`` at the end; :class:`HTTPError` if the connection
        failed, :class:`TimeoutError` if nothing came for ``timeout`` seconds."""
        while True:
            if self.chunks:
                return self.take()
            if self.complete:
                return None
            if self.error is not None:
                raise self.error
            await self.wait(timeout)


class Pool:
    """Keep-alive connections per origin, at most ``max_connections`` open in all (and at
    most an origin's own ``limit`` to it). An idle connection is closed ``keepalive`` seconds
    (the origin's own, if set) after its last response, by a timer, so that it is neither
    reused nor left open when the upstream is about to close it. Bound to the event loop it
    was made in."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        max_connections: int = 1000,
        keepalive: float = 4.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.loop = loop
        self.max_connections = max_connections
        self.keepalive = keepalive
        self._ssl = ssl_context
        self._idle: dict[tuple, list[Connection]] = {}  # oldest first
        self._open = 0
        self._per_origin: dict[tuple, int] = {}
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._origin_waiters: dict[tuple, collections.deque[asyncio.Future]] = {}
        self._sweep_at: asyncio.TimerHandle | None = None
        self._retired: set[tuple] = set()  # origins whose connections close when released

    @property
    def open_connections(self) -> int:
        return self._open

    def idle_connections(self) -> int:
        return sum(len(v) for v in self._idle.values())

    def _keepalive(self, origin: Origin) -> float:
        return self.keepalive if origin.keepalive is None else origin.keepalive

    async def acquire(self, origin: Origin, timeout: float, *, fresh: bool = False) -> Connection:
        """A connection to ``origin``: an idle one if any is fresh, else (or with
        ``fresh``) a new one. ``timeout`` bounds the wait for a free slot and the connect."""
        idle = None if fresh else self._idle.get(origin.key)
        if idle:
            oldest = self.loop.time() - self._keepalive(origin)
            while idle:
                conn = idle.pop()
                if not conn.closed and conn.idle_since > oldest:
                    conn.reused = True
                    return conn
                self.discard(conn)
        return await self._connect(origin, timeout)

    async def _connect(self, origin: Origin, timeout: float) -> Connection:
        loop = self.loop
        key = origin.key
        limit = self.max_connections if origin.limit is None else origin.limit
        deadline = loop.time() + timeout
        while True:
            if self._per_origin.get(key, 0) >= limit:
                if self._close_idle(key):
                    continue  # an idle connection to this origin gave way (a fresh one)
                queue = self._origin_waiters.setdefault(key, collections.deque())
            elif self._open >= self.max_connections:
                if self._close_idle(None, but=key):
                    continue  # an idle connection to another origin gave way
                queue = self._waiters
            else:
                break
            w = loop.create_future()
            queue.append(w)
            timer = loop.call_later(max(deadline - loop.time(), 0.0), _expire, w)
            try:
                await w
            finally:
                timer.cancel()
                if not w.done():
                    w.cancel()
            idle = self._idle.get(key)
            if idle:
                return await self.acquire(origin, deadline - loop.time())
        self._open += 1
        self._per_origin[key] = self._per_origin.get(key, 0) + 1
        self._retired.discard(key)  # wanted again (a reload put the replica back)
        conn = Connection(self, origin)
        try:
            async with asyncio.timeout(max(deadline - loop.time(), 0.0)):
                await loop.create_connection(
                    lambda: conn,
                    origin.host,
                    origin.port,
                    ssl=(origin.ssl_context or self._ssl_context()) if origin.tls else None,
                    server_hostname=origin.host if origin.tls else None,
                )
        except BaseException:
            self._uncount(conn)
            conn.close()
            raise
        return conn

    def _close_idle(self, key: tuple | None, *, but: tuple | None = None) -> bool:
        """At a cap, close the longest-idle connection (to ``key``, or to any origin but
        ``but``)."""
        oldest: Connection | None = None
        for k, conns in self._idle.items():
            if (
                (k == key if key is not None else k != but)
                and conns
                and (oldest is None or conns[0].idle_since < oldest.idle_since)
            ):
                oldest = conns[0]
        if oldest is None:
            return False
        self._idle[oldest.origin.key].remove(oldest)
        self.discard(oldest)
        return True

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def release(self, conn: Connection) -> None:
        """Done with ``conn``'s response: keep the connection if it can carry another."""
        conn._stop_timer()
        if conn.reusable() and conn.origin.key not in self._retired:
            conn.idle_since = self.loop.time()
            self._idle.setdefault(conn.origin.key, []).append(conn)
            if self._sweep_at is None:
                self._sweep_at = self.loop.call_later(self._keepalive(conn.origin), self._sweep)
            self._notify(conn.origin.key)
        else:
            self.discard(conn)

    def retire(self, match: Callable[[tuple], bool]) -> int:
        """The origins whose key ``match``es are no longer used (a reload removed the
        replica): their idle connections are closed now, those in use when released.
        Returns the number closed now."""
        keys = {k for k in (*self._idle, *self._per_origin) if match(k)}
        self._retired |= keys
        closed = 0
        for key in keys:
            for conn in self._idle.pop(key, ()):
                self.discard(conn)
                closed += 1
        return closed

    def _sweep(self) -> None:
        """Close the connections idle for longer than their keep-alive; come back when the
        next one will be."""
        self._sweep_at = None
        now = self.loop.time()
        later = None
        for conns in self._idle.values():
            while conns:
                conn = conns[0]
                until = conn.idle_since + self._keepalive(conn.origin)
                if until > now:
                    later = until if later is None else min(later, until)
                    break
                conns.pop(0)
                self.discard(conn)
        if later is not None:
            self._sweep_at = self.loop.call_at(later, self._sweep)

    def discard(self, conn: Connection) -> None:
        conn.abort()
        self._uncount(conn)

    def _lost(self, conn: Connection) -> None:
        idle = self._idle.get(conn.origin.key)
        if idle and conn in idle:
            idle.remove(conn)
        self._uncount(conn)

    def _uncount(self, conn: Connection) -> None:
        if conn.counted:
            conn.counted = False
            self._open -= 1
            key = conn.origin.key
            left = self._per_origin[key] - 1
            if left:
                self._per_origin[key] = left
            else:
                del self._per_origin[key]
            self._notify(key)

    def _notify(self, key: tuple) -> None:
        """A slot (or an idle connection) to ``key`` is free: wake a request waiting for
        that origin, else one waiting for any slot."""
        queue = self._origin_waiters.get(key)
        for waiters in (queue, self._waiters):
            while waiters:
                w = waiters.popleft()
                if not w.done():
                    w.set_result(None)
                    return

    def close(self) -> None:
        """Close the idle connections (nothing is in flight on them, so a TLS one is not
        kept open for a shutdown exchange the loop may not live to finish)."""
        if self._sweep_at is not None:
            self._sweep_at.cancel()
            self._sweep_at = None
        for conns in self._idle.values():
            for conn in conns:
                conn.abort()
        self._idle.clear()


def request_head(method: str, path: str, origin: Origin, headers: dict, length: int) -> bytes:
    """The request line and headers. Header names and values must not hold CR or LF."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {origin.host_header}"]
    for name, value in headers.items():
        value = str(value)
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value or ":" in name:
            raise ValueError(f"header {name!r} holds a forbidden character")
        lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
