"""The gateway's own HTTP/1.1 server (``prefixgate.serve.httpserver``), over loopback TCP.

Raw sockets write exact bytes (framing, pipelining, limits, malformed input) and the
answers are parsed by hand (``Conn``); httpx is used where any client's framing will do.
The apps are small raw ASGI callables (``Probe``) or Starlette apps defined here. Waits
are on events wherever the order can be observed, not on sleeps."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import gc
import os
import socket
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from prefixgate.serve import httpserver
from prefixgate.serve.process import ServerThread, bind

TIMEOUT = 5.0  # for anything that should happen at once: a hang fails, it does not block


# -- the client side: exact bytes out, answers parsed by hand ------------------------------
def request(
    method: str = "GET",
    target: str = "/",
    headers: tuple[tuple[str, str], ...] = (),
    body: bytes = b"",
    version: str = "1.1",
) -> bytes:
    """A request's bytes; ``Content-Length`` is added for a body unless framed already."""
    lines = [f"{method} {target} HTTP/{version}", "Host: localhost"]
    lines += [f"{name}: {value}" for name, value in headers]
    framed = {name.lower() for name, _ in headers} & {"content-length", "transfer-encoding"}
    if body and not framed:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def chunked(*parts: bytes, end: bool = True) -> bytes:
    """``parts`` in chunked framing, with the last chunk when ``end``."""
    data = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts)
    return data + b"0\r\n\r\n" if end else data


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]  # lower-case names, in order
    body: bytes = b""
    chunks: list[bytes] | None = None  # a chunked body's chunks, as framed by the server

    def header(self, name: str) -> str | None:
        values = [v for n, v in self.headers if n == name]
        assert len(values) <= 1, f"{name} more than once: {values}"
        return values[0] if values else None


class Conn:
    """A raw client connection to the server on loopback."""

    def __init__(self, port: int, timeout: float = TIMEOUT, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.timeout = timeout
        self.buf = bytearray()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_until_reset(self, data: bytes) -> None:
        """Send what the server may refuse midway (it answers and closes while we write)."""
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            self.sock.sendall(data)

    def _fill(self) -> None:
        try:
            data = self.sock.recv(1 << 16)
        except ConnectionResetError:
            data = b""
        if not data:
            raise EOFError(f"the server closed the connection; unread: {bytes(self.buf)!r}")
        self.buf += data

    def _take(self, n: int) -> bytes:
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def read_line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            self._fill()
        return self._take(end + 2)[:-2]

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        return self._take(n)

    def read_to_eof(self) -> bytes:
        with contextlib.suppress(EOFError):
            while True:
                self._fill()
        return self._take(len(self.buf))

    def read_head(self) -> Response:
        version, status, *_ = self.read_line().decode("latin-1").split(" ", 2)
        assert version == "HTTP/1.1", version
        headers = []
        while line := self.read_line():
            name, _, value = line.decode("latin-1").partition(":")
            headers.append((name.lower(), value.strip()))
        return Response(int(status), headers)

    def read_chunk(self) -> bytes:
        """The next chunk of a chunked body: ``b""`` for the last one (trailers read)."""
        size = int(self.read_line(), 16)
        if size == 0:
            while self.read_line():
                pass
            return b""
        data = self.read_exact(size)
        assert self.read_line() == b"", "chunk data not followed by CRLF"
        return data

    def read_response(self, method: str = "GET") -> Response:
        """One whole response (an interim 1xx one is returned as it is)."""
        r = self.read_head()
        te = r.header("transfer-encoding")
        length = r.header("content-length")
        if method == "HEAD" or r.status in (204, 304) or r.status < 200:
            assert te is None or method == "HEAD", r.headers
        elif te is not None:
            assert te == "chunked", te
            r.chunks = []
            while chunk := self.read_chunk():
                r.chunks.append(chunk)
            r.body = b"".join(r.chunks)
        elif length is not None:
            r.body = self.read_exact(int(length))
        else:
            r.body = self.read_to_eof()
        return r

    def wait_closed(self, timeout: float | None = None) -> bytes:
        """Wait for the server to close the connection; what arrived before (``b""`` when
        nothing did). Raises ``TimeoutError`` if it stays open."""
        self.sock.settimeout(self.timeout if timeout is None else timeout)
        try:
            return self.read_to_eof()
        finally:
            self.sock.settimeout(self.timeout)

    def nothing_within(self, seconds: float) -> bool:
        """True if no byte arrives (and the connection stays open) for ``seconds``."""
        if self.buf:
            return False
        self.sock.settimeout(seconds)
        try:
            self._fill()
        except TimeoutError:
            return True
        except EOFError:
            return False
        finally:
            self.sock.settimeout(self.timeout)
        return False


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


# -- the server side -----------------------------------------------------------------------
class Running:
    """``httpserver.Server`` under ``asyncio.run`` in a thread, on a loopback socket;
    ``error`` is what ``serve`` raised."""

    def __init__(self, server: httpserver.Server, *, listen: bool = True) -> None:
        self.server = server
        self.sock = bind("127.0.0.1", 0, listen=listen)
        self.port = self.sock.getsockname()[1]
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self.server.serve([self.sock]))
        except BaseException as exc:  # SystemExit included
            self.error = exc

    def start(self, wait: bool = True) -> Running:
        self.thread.start()
        deadline = time.monotonic() + TIMEOUT
        while wait and not self.server.started:
            assert self.thread.is_alive(), f"the server stopped: {self.error!r}"
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive(), "the server did not stop"
        self.sock.close()

    def __enter__(self) -> Running:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


async def wait_for(event: threading.Event, timeout: float = TIMEOUT) -> None:
    """Await a ``threading.Event`` set by the test (polled: cancellable at once)."""
    deadline = time.monotonic() + timeout
    while not event.is_set():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never released the app")
        await asyncio.sleep(0.005)


async def start(send, status: int = 200, headers: tuple = ()) -> None:
    await send({"type": "http.response.start", "status": status, "headers": list(headers)})


async def body(send, data: bytes = b"", more: bool = False) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})


async def respond(send, data: bytes, status: int = 200, headers: tuple = ()) -> None:
    length = (b"content-length", str(len(data)).encode())
    await start(send, status, (*headers, length))
    await body(send, data)


LIMIT = 1000  # max_body and max_header_bytes where the limits are tested
BIG = 32 * 1024 * 1024  # the /big response: far more than the socket buffers hold


@dataclass
class Probe:
    """A raw ASGI app without lifespan support, a route (``r_<name>``) per behaviour; it
    records what it saw so that the test can wait for it and check it."""

    entered: threading.Event = field(default_factory=threading.Event)  # the app is running
    release: threading.Event = field(default_factory=threading.Event)  # the test lets it go
    stopped: threading.Event = field(default_factory=threading.Event)  # the app has ended
    outcome: str = ""  # how it ended: cancelled, OSError, http.disconnect
    sent: int = 0  # what a streaming route has sent so far
    requests: list[dict] = field(default_factory=list)  # the first receive() message of each

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            raise RuntimeError("this app has no lifespan")
        route = getattr(self, "r_" + scope["path"].strip("/"), None)
        if route is None:
            await respond(send, b"not found", 404)
        else:
            await route(scope, receive, send)

    async def _body(self, receive) -> bytes:
        message = await receive()
        self.requests.append(message)
        return message["body"]

    async def r_len(self, scope, receive, send) -> None:
        await respond(send, b"hello")

    async def r_chunked(self, scope, receive, send) -> None:
        await start(send, 200, [(b"content-type", b"text/plain")])
        await body(send, b"hel", more=True)
        await body(send, b"lo")

    async def r_echo(self, scope, receive, send) -> None:
        data = await self._body(receive)
        query = scope["query_string"].decode()
        if query.startswith("delay="):
            await asyncio.sleep(float(query.removeprefix("delay=")))
        headers = [(b"x-path", scope["path"].encode()), (b"x-query", query.encode())]
        await respond(send, data, headers=headers)

    async def r_limit(self, scope, receive, send) -> None:
        """413 in the app's own shape when the declared or received body is past LIMIT."""
        data = await self._body(receive)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if len(data) > LIMIT or int(declared) > LIMIT:
            await respond(send, b"too large: got %d" % len(data), 413)
        else:
            await respond(send, b"ok: got %d" % len(data))

    async def r_empty(self, scope, receive, send) -> None:
        await start(send, 204)
        await body(send)

    async def r_gated(self, scope, receive, send) -> None:
        """A streaming answer: one chunk, then (once released) another and the end."""
        await start(send, 200)
        await body(send, b"first", more=True)
        self.entered.set()
        await wait_for(self.release)
        await body(send, b"second", more=True)
        await body(send)

    async def r_held(self, scope, receive, send) -> None:
        """An answer held until the test releases it."""
        self.entered.set()
        await wait_for(self.release)
        await respond(send, b"done")

    async def r_slow(self, scope, receive, send) -> None:
        """Five seconds of work: records a cancellation."""
        self.entered.set()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            self.outcome = "cancelled"
            raise
        finally:
            self.stopped.set()
        await respond(send, b"slow")

    async def r_wait_disconnect(self, scope, receive, send) -> None:
        await self._body(receive)
        self.entered.set()
        try:
            self.outcome = (await receive())["type"]
        except asyncio.CancelledError:
            self.outcome = "cancelled"
            raise
        finally:
            self.stopped.set()

    async def r_firehose(self, scope, receive, send) -> None:
        """Streams small chunks until something stops it."""
        await start(send, 200)
        try:
            while True:
                await body(send, b"x" * 100, more=True)
                self.sent += 1
                self.entered.set()
                await asyncio.sleep(0.01)
        except (OSError, asyncio.CancelledError) as exc:
            self.outcome = "cancelled" if isinstance(exc, asyncio.CancelledError) else "OSError"
            raise
        finally:
            self.stopped.set()

    async def r_big(self, scope, receive, send) -> None:
        await start(send, 200)
        piece = b"b" * 65536
        while self.sent < BIG:
            await body(send, piece, more=True)
            self.sent += len(piece)
        await body(send)

    async def r_fail_early(self, scope, receive, send) -> None:
        raise RuntimeError("failed before answering")

    async def r_no_answer(self, scope, receive, send) -> None:
        return None

    async def r_bad_header(self, scope, receive, send) -> None:
        """A response header that would inject another: which one the query says."""
        name, value = {
            b"crlf": (b"x-evil", b"a\r\nInjected: 1"),
            b"lf": (b"x-evil", b"a\nInjected: 1"),
            b"cr": (b"x-evil", b"a\rInjected: 1"),
            b"name": (b"x-evil\r\nInjected", b"1"),
            b"name-lf": (b"x-evil\nInjected", b"1"),
        }[scope["query_string"]]
        await respond(send, b"evil", headers=((name, value),))

    async def r_fail_late(self, scope, receive, send) -> None:
        await start(send, 200)
        await body(send, b"partial", more=True)
        raise RuntimeError("failed mid-answer")


@pytest.fixture
def probe() -> Probe:
    return Probe()


@pytest.fixture
def srv(probe):
    with ServerThread(probe) as s:
        yield s


# -- 1. keep-alive ---------------------------------------------------------------------------
def test_keep_alive_serves_several_requests_on_one_connection(probe, srv):
    with Conn(srv.port) as c:
        c.send(request("GET", "/len"))
        r = c.read_response()
        assert (r.status, r.body) == (200, b"hello")
        assert r.header("content-length") == "5" and r.header("transfer-encoding") is None
        assert r.header("connection") is None
        date = email.utils.parsedate_to_datetime(r.header("date"))
        assert abs(date.timestamp() - time.time()) < 5

        c.send(request("GET", "/chunked"))
        r = c.read_response()
        assert r.status == 200 and r.header("transfer-encoding") == "chunked"
        assert r.header("content-length") is None
        assert r.chunks == [b"hel", b"lo"]  # one chunk per body message

        c.send(request("GET", "/gated"))
        r = c.read_head()
        assert r.status == 200 and r.header("transfer-encoding") == "chunked"
        assert c.read_chunk() == b"first"
        assert probe.entered.wait(TIMEOUT)
        assert c.nothing_within(0.1)  # the rest is not written yet
        probe.release.set()
        assert c.read_chunk() == b"second"
        assert c.read_chunk() == b""

        c.send(request("POST", "/echo", body=b"still here"))
        assert c.read_response().body == b"still here"


def test_http10_without_keep_alive_is_answered_then_closed(srv):
    with Conn(srv.port) as c:  # no length known: the body ends with the connection
        c.send(request("GET", "/chunked", version="1.0"))
        r = c.read_response()
        assert (r.status, r.body) == (200, b"hello")
        assert r.header("transfer-encoding") is None and r.header("content-length") is None
        assert r.header("connection") == "close"
    with Conn(srv.port) as c:
        c.send(request("GET", "/len", version="1.0"))
        r = c.read_response()
        assert (r.status, r.body, r.header("content-length")) == (200, b"hello", "5")
        assert c.wait_closed() == b""


def test_http10_keep_alive_keeps_the_connection_for_a_known_length(srv):
    with Conn(srv.port) as c:
        for _ in range(2):
            c.send(request("GET", "/len", (("Connection", "keep-alive"),), version="1.0"))
            r = c.read_response()
            assert (r.status, r.body) == (200, b"hello")
        # without a length, the body has to end with the connection
        c.send(request("GET", "/chunked", (("Connection", "keep-alive"),), version="1.0"))
        r = c.read_response()
        assert r.body == b"hello" and r.header("connection") == "close"


def test_connection_close_closes_after_the_answer(srv):
    with Conn(srv.port) as c:
        c.send(request("GET", "/chunked", (("Connection", "close"),)))
        r = c.read_response()
        assert r.status == 200 and r.chunks == [b"hel", b"lo"]
        assert r.header("connection") == "close"
        assert c.wait_closed() == b""


def test_app_asking_for_close_closes_after_the_answer():
    async def app(scope, receive, send):
        assert scope["type"] == "http", "no lifespan here"
        await respond(send, b"bye", headers=((b"Connection", b"close"),))

    with ServerThread(app) as s, Conn(s.port) as c:
        c.send(request("GET", "/"))
        r = c.read_response()
        assert r.body == b"bye" and ("connection", "close") in r.headers
        assert c.wait_closed() == b""


# -- 2. pipelining -------------------------------------------------------------------------
def test_pipelined_requests_are_answered_in_order(probe, srv):
    with Conn(srv.port) as c:
        c.send(
            request("POST", "/echo?delay=0.1", body=b"one")  # the slowest first
            + request("GET", "/chunked")
            + request("POST", "/echo", body=b"three")
            + request("HEAD", "/len")
            + request("GET", "/echo?delay=0")
        )
        first = c.read_response()
        assert (first.body, first.header("x-query")) == (b"one", "delay=0.1")
        assert c.read_response().chunks == [b"hel", b"lo"]
        assert c.read_response().body == b"three"
        head = c.read_response("HEAD")
        assert head.header("content-length") == "5" and head.body == b""
        last = c.read_response()
        assert (last.status, last.body, last.header("x-query")) == (200, b"", "delay=0")
        assert c.nothing_within(0.05)  # nothing more was written


# -- 3. request bodies -------------------------------------------------------------------------
def test_content_length_body_reaches_the_app_whole(probe, srv):
    payload = os.urandom(300_000)
    with Conn(srv.port) as c:
        c.send(request("POST", "/echo", body=payload))
        assert c.read_response().body == payload
    assert probe.requests == [{"type": "http.request", "body": payload, "more_body": False}]


def test_chunked_body_reaches_the_app_whole(probe, srv):
    parts = [b"alpha-", os.urandom(70_000), b"-omega"]
    head = request("POST", "/echo", (("Transfer-Encoding", "chunked"),))
    with Conn(srv.port) as c:
        c.send(head)
        for part in parts:  # the body arrives in pieces
            c.send(chunked(part, end=False))
        assert c.nothing_within(0.05)  # the app waits for the whole body
        c.send(chunked())
        assert c.read_response().body == b"".join(parts)
    assert probe.requests == [{"type": "http.request", "body": b"".join(parts), "more_body": False}]


def test_bodies_sent_by_httpx(srv):
    payload = os.urandom(1_000_000)
    with httpx.Client(base_url=srv.url, timeout=TIMEOUT) as client:
        assert client.post("/echo", content=payload).content == payload
        pieces = [payload[i : i + 100_000] for i in range(0, len(payload), 100_000)]
        r = client.post("/echo", content=iter(pieces))  # chunked
        assert r.content == payload
        assert r.headers["x-path"] == "/echo"


def test_expect_100_continue_is_answered_before_the_body(probe, srv):
    with Conn(srv.port) as c:
        c.send(request("POST", "/echo", (("Content-Length", "5"), ("Expect", "100-continue"))))
        interim = c.read_response()
        assert (interim.status, interim.headers) == (100, [])
        assert probe.requests == []  # the app runs once the body is in
        c.send(b"hello")
        r = c.read_response()
        assert (r.status, r.body) == (200, b"hello")


# -- 4. limits ---------------------------------------------------------------------------------
@pytest.fixture
def limited(probe):
    with ServerThread(probe, max_body=LIMIT, max_header_bytes=LIMIT) as s:
        yield s


def test_body_under_the_limit_is_served(limited):
    with Conn(limited.port) as c:
        c.send(request("POST", "/limit", body=b"x" * LIMIT))
        r = c.read_response()
        assert (r.status, r.body) == (200, b"ok: got 1000")
        assert r.header("connection") is None


@pytest.mark.parametrize("expect", [False, True])
def test_declared_length_past_max_body_runs_the_app_at_once(probe, limited, expect):
    headers = (("Content-Length", str(LIMIT * 100)),)
    if expect:
        headers += (("Expect", "100-continue"),)
    with Conn(limited.port) as c:
        c.send(request("POST", "/limit", headers) + b"x" * 10)  # most of the body never comes
        r = c.read_response()  # no 100 Continue: the answer is final
        assert (r.status, r.body) == (413, b"too large: got 0")
        assert r.header("connection") == "close"
        assert c.wait_closed() == b""
    assert probe.requests == [{"type": "http.request", "body": b"", "more_body": False}]


def test_chunked_body_growing_past_max_body_runs_the_app_at_once(probe, limited):
    sent = os.urandom(600) + os.urandom(600)
    with Conn(limited.port) as c:
        head = request("POST", "/limit", (("Transfer-Encoding", "chunked"),))
        c.send(head + chunked(sent[:600], sent[600:], end=False))  # and it never ends
        r = c.read_response()
        assert r.status == 413 and r.header("connection") == "close"
        assert c.wait_closed() == b""
    (message,) = probe.requests
    assert LIMIT < len(message["body"]) <= len(sent) and sent.startswith(message["body"])
    assert message["more_body"] is False


@pytest.mark.parametrize(
    "headers",
    [
        (("X-Big", "a" * (LIMIT + 1)),),
        tuple((f"X-Small-{i}", "a" * 40) for i in range(30)),  # in all
    ],
    ids=["one-header", "many-headers"],
)
def test_headers_past_max_header_bytes_get_431(probe, limited, headers):
    with Conn(limited.port) as c:
        c.send_until_reset(request("GET", "/len", headers))
        r = c.read_response()
        assert r.status == 431 and r.header("connection") == "close"
        assert c.wait_closed() == b""
    assert probe.requests == [] and not probe.entered.is_set()
    with Conn(limited.port) as c:  # just under it is fine
        c.send(request("GET", "/len", (("X-Big", "a" * (LIMIT - 100)),)))
        assert c.read_response().status == 200


def test_request_target_past_64_kib_gets_414(srv):
    with Conn(srv.port) as c:
        c.send_until_reset(request("GET", "/echo?" + "q" * 70_000))
        r = c.read_response()
        assert r.status == 414 and r.header("connection") == "close"
        assert c.wait_closed() == b""
    with Conn(srv.port) as c:  # just under it is fine
        c.send(request("GET", "/echo?" + "q" * 60_000))
        r = c.read_response()
        assert r.status == 200 and r.header("x-query") == "q" * 60_000


@pytest.mark.parametrize(
    "data",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: localhost\r\nno colon here\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: abc\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=["request-line", "header-line", "content-length", "chunk-size"],
)
def test_malformed_request_gets_400_and_close(probe, srv, data):
    with Conn(srv.port) as c:
        c.send(request("GET", "/len"))  # a good request first: the connection was fine
        assert c.read_response().body == b"hello"
        c.send_until_reset(data)
        r = c.read_response()
        assert r.status == 400 and r.header("connection") == "close"
        assert r.body.startswith(b"malformed HTTP request")
        assert c.wait_closed() == b""
    assert probe.requests == []


# -- 5. bodiless answers -------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/len", "/chunked"])
def test_head_gets_the_headers_without_the_body(srv, path):
    with Conn(srv.port) as c:
        c.send(request("HEAD", path))
        r = c.read_response("HEAD")
        assert r.status == 200 and r.body == b""
        if path == "/len":
            assert r.header("content-length") == "5"
        else:  # no framing for a body that is not sent
            assert r.header("transfer-encoding") is None
        c.send(request("GET", "/len"))  # proves that no body byte was written
        assert c.read_response().body == b"hello"


def test_204_has_no_body_and_no_chunked_framing(srv):
    with Conn(srv.port) as c:
        c.send(request("GET", "/empty"))
        r = c.read_response()
        assert r.status == 204
        assert r.header("transfer-encoding") is None and r.header("content-length") is None
        c.send(request("GET", "/len"))  # proves that no body byte was written
        assert c.read_response().body == b"hello"


# -- 6. app failures ---------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/fail_early", "/no_answer"])
def test_app_failing_before_answering_gets_500_and_close(srv, path):
    with Conn(srv.port) as c:
        c.send(request("GET", path))
        r = c.read_response()
        assert (r.status, r.body) == (500, b"Internal Server Error")
        assert r.header("connection") == "close"
        assert c.wait_closed() == b""


@pytest.mark.parametrize("variant", ["crlf", "lf", "cr", "name", "name-lf"])
def test_a_response_header_that_would_inject_gets_500_and_close(srv, variant):
    """A CR or LF in a header's name or value is refused before any byte of the head."""
    with Conn(srv.port) as c:
        c.send(request("GET", f"/bad_header?{variant}"))
        r = c.read_response()
        assert (r.status, r.body) == (500, b"Internal Server Error")
        assert r.header("injected") is None and r.header("x-evil") is None
        assert c.wait_closed() == b""


def test_app_failing_mid_answer_closes_the_connection(srv):
    with Conn(srv.port) as c:
        c.send(request("GET", "/fail_late"))
        r = c.read_head()
        assert r.status == 200 and r.header("transfer-encoding") == "chunked"
        assert c.read_chunk() == b"partial"
        with pytest.raises(EOFError):  # a truncated body, not a hang (that would time out)
            c.read_chunk()


# -- 7. the client going away -------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/slow", "/wait_disconnect"])
def test_client_leaving_mid_request_stops_the_app_at_once(probe, srv, path):
    with Conn(srv.port) as c:
        c.send(request("GET", path))
        assert probe.entered.wait(TIMEOUT)
    assert probe.stopped.wait(1.0)
    expected = {"cancelled"} if path == "/slow" else {"cancelled", "http.disconnect"}
    assert probe.outcome in expected


def test_client_leaving_a_stream_stops_the_app(probe, srv):
    with Conn(srv.port) as c:
        c.send(request("GET", "/firehose"))
        assert c.read_head().status == 200
        assert c.read_chunk() == b"x" * 100
    assert probe.stopped.wait(1.0)
    assert probe.outcome in ("cancelled", "OSError")
    sent = probe.sent
    time.sleep(0.1)
    assert probe.sent == sent


def test_slow_reader_pauses_the_app(probe, srv):
    with Conn(srv.port, rcvbuf=65536) as c:
        c.send(request("GET", "/big"))
        while probe.sent == 0:
            time.sleep(0.01)
        last = -1
        while probe.sent != last:  # until the app's progress stalls on the full buffers
            last = probe.sent
            time.sleep(0.2)
        assert 0 < probe.sent < BIG // 2
        r = c.read_response()
        assert len(r.body) == BIG and r.body.count(b"b") == BIG


# -- 8. lifespan ---------------------------------------------------------------------------------
def test_lifespan_startup_before_serving_and_shutdown_at_stop():
    events: list[str] = []
    go = threading.Event()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await wait_for(go)
        events.append("startup")
        yield {"greeting": "hi"}
        events.append("shutdown")

    async def seen(request: Request):
        return JSONResponse({"events": list(events), "greeting": request.state.greeting})

    app = Starlette(routes=[Route("/seen", seen)], lifespan=lifespan)
    run = Running(httpserver.Server(app)).start(wait=False)
    try:
        with Conn(run.port) as c:  # the socket listens already; the server must not serve
            c.send(request("GET", "/seen"))
            assert c.nothing_within(0.2)
            assert not run.server.started
            go.set()
            r = c.read_response()
            assert r.status == 200
            assert r.body == b'{"events":["startup"],"greeting":"hi"}'
    finally:
        go.set()
        run.stop()
    assert events == ["startup", "shutdown"]
    assert run.error is None


def test_failing_startup_exits_3_and_never_listens():
    @contextlib.asynccontextmanager
    async def lifespan(app):
        raise RuntimeError("no database")
        yield

    started = []
    server = httpserver.Server(Starlette(lifespan=lifespan), on_started=lambda: started.append(1))
    run = Running(server, listen=False)
    try:
        run.start(wait=False)
        run.thread.join(TIMEOUT)
        assert not run.thread.is_alive()
        assert isinstance(run.error, SystemExit) and run.error.code == 3
        assert not server.started and started == []
        assert refused(run.port)
    finally:
        run.sock.close()


async def _returns_on_lifespan(scope, receive, send):
    if scope["type"] == "lifespan":
        return
    await respond(send, b"served")


async def _raises_on_lifespan(scope, receive, send):
    assert scope["type"] == "http", "no lifespan here"
    await respond(send, b"served")


@pytest.mark.parametrize("app", [_raises_on_lifespan, _returns_on_lifespan])
def test_app_without_lifespan_support_still_serves(app):
    with Running(httpserver.Server(app)) as run:
        r = httpx.get(f"http://127.0.0.1:{run.port}/", timeout=TIMEOUT)
        assert (r.status_code, r.content) == (200, b"served")
    assert run.error is None


# -- 9. graceful stop ------------------------------------------------------------------------------
def test_graceful_stop_lets_the_request_in_flight_finish(probe):
    run = Running(httpserver.Server(probe, graceful=5)).start()
    try:
        with Conn(run.port) as idle, Conn(run.port) as busy:
            idle.send(request("GET", "/len"))
            assert idle.read_response().status == 200
            busy.send(request("GET", "/held"))
            assert probe.entered.wait(TIMEOUT)

            run.server.should_exit = True
            assert idle.wait_closed() == b""  # the idle keep-alive connection goes at once
            assert refused(run.port)  # no new connection
            assert run.thread.is_alive()  # the drain waits for the request in flight

            probe.release.set()
            r = busy.read_response()
            assert (r.status, r.body) == (200, b"done")
            assert r.header("connection") == "close"
            assert busy.wait_closed() == b""
        run.thread.join(TIMEOUT)
        assert not run.thread.is_alive() and run.error is None
    finally:
        probe.release.set()
        run.stop()


def test_graceful_timeout_cancels_what_is_left(probe):
    run = Running(httpserver.Server(probe, graceful=0.2)).start()
    try:
        with Conn(run.port) as c:
            c.send(request("GET", "/slow"))  # five seconds of work
            assert probe.entered.wait(TIMEOUT)
            run.server.should_exit = True
            run.thread.join(TIMEOUT)
            assert not run.thread.is_alive()
            # Cancelled, not left to finish its five seconds.
            assert probe.stopped.is_set() and probe.outcome == "cancelled"
            assert c.wait_closed() == b""  # closed without an answer
        assert run.error is None
    finally:
        run.stop()


def test_server_thread_stop_runs_the_drain_and_the_lifespan_shutdown():
    events: list[str] = []

    @contextlib.asynccontextmanager
    async def lifespan(app):
        events.append("startup")
        yield
        events.append("shutdown")

    async def hello(request: Request):
        return PlainTextResponse("hi")

    app = Starlette(routes=[Route("/", hello)], lifespan=lifespan)
    with ServerThread(app, graceful=1) as s:
        assert httpx.get(s.url, timeout=TIMEOUT).text == "hi"
        assert events == ["startup"]
        port = s.port
    assert events == ["startup", "shutdown"]
    assert refused(port)


# -- 10. idle keep-alive timeout ------------------------------------------------------------------
def test_idle_keep_alive_connection_is_closed_after_keepalive(probe):
    with Running(httpserver.Server(probe, keepalive=0.3)) as run:
        with Conn(run.port) as c:
            c.send(request("POST", "/echo?delay=0.5", body=b"slow"))  # longer than keepalive
            assert c.read_response().body == b"slow"  # a request is not idle
            t0 = time.monotonic()
            assert c.wait_closed(TIMEOUT) == b""
            assert time.monotonic() - t0 >= 0.25  # not before its keep-alive ran out
        with Conn(run.port) as c:  # a connection that never sends anything
            t0 = time.monotonic()
            assert c.wait_closed(TIMEOUT) == b""
            assert time.monotonic() - t0 >= 0.25


# -- found by these tests, fixed ------------------------------------------------------------------
def test_pipelined_expect_continue_does_not_break_the_response_in_progress(probe, srv):
    with Conn(srv.port) as c:
        c.send(request("GET", "/gated"))
        assert c.read_head().status == 200
        assert c.read_chunk() == b"first"
        c.send(request("POST", "/echo", (("Content-Length", "3"), ("Expect", "100-continue"))))
        time.sleep(0.1)  # the server has read the second request's head
        probe.release.set()
        assert c.read_chunk() == b"second"
        assert c.read_chunk() == b""


def test_unterminated_header_line_past_max_header_bytes_is_refused(limited):
    with Conn(limited.port, timeout=1.0) as c:
        c.send_until_reset(b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * (100 * LIMIT))
        assert c.read_response().status == 431


def test_a_refused_connection_is_freed_without_the_cyclic_collector(limited):
    """An endless header line's buffer goes with its connection, not at the next full
    collection (which a serving process's high GC threshold makes rare)."""

    def alive() -> list:
        return [
            o
            for o in gc.get_objects()
            if isinstance(o, httpserver.HTTPProtocol) and o.server is limited.server
        ]

    gc.collect()
    gc.disable()
    try:
        with Conn(limited.port, timeout=1.0) as c:
            c.send_until_reset(
                b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * (100 * LIMIT)
            )
            assert c.read_response().status == 431
            c.wait_closed()
        deadline = time.monotonic() + TIMEOUT
        while alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert alive() == []
    finally:
        gc.enable()


def test_upgrade_request_is_answered_in_http11_and_the_connection_goes_on(probe, srv):
    with Conn(srv.port) as c:
        c.send(request("GET", "/echo", (("Connection", "Upgrade"), ("Upgrade", "websocket"))))
        assert c.read_response().status == 200  # the upgrade is not taken
        c.send(request("GET", "/echo"))
        assert c.read_response().status == 200
    assert len(probe.requests) == 2


def test_background_task_failing_does_not_cut_the_next_request(probe):
    async def fail_later():
        await wait_for(probe.entered)  # the next request is in flight
        raise RuntimeError("background task failed")

    async def first(request: Request):
        return PlainTextResponse("first", background=BackgroundTask(fail_later))

    async def held(request: Request):
        probe.entered.set()
        await wait_for(probe.release)
        return PlainTextResponse("done")

    app = Starlette(routes=[Route("/first", first), Route("/held", held)])
    with ServerThread(app) as s, Conn(s.port) as c:
        c.send(request("GET", "/first"))
        assert c.read_response().body == b"first"
        c.send(request("GET", "/held"))
        assert probe.entered.wait(TIMEOUT)
        time.sleep(0.05)  # the background task has failed
        probe.release.set()
        assert c.read_response().body == b"done"
