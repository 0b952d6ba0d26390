"""The upstream hop's own HTTP/1.1 client (``prefixgate.upstream.http1`` behind ``Upstream``), tested
on loopback against raw asyncio servers that write exact bytes, so that every behaviour
(keep-alive, stale connections, chunking, interim answers, failures, flow control, the
connection cap) is under the test's control."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import ssl
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from prefixgate.config import Timeouts
from prefixgate.errors import UpstreamError, UpstreamTimeout
from prefixgate.upstream import Upstream, UpstreamResponse, UpstreamStatus, http1
from tests.certs import self_signed

PATH = "/v1/chat/completions"
BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
FAST = Timeouts(connect=1.0, first_byte=2.0, idle=2.0)


# -- a raw loopback server ------------------------------------------------------------------
@dataclass
class Request:
    conn: int  # index of the connection it came on (0 = the first one accepted)
    line: str  # the request line
    headers: dict[str, str]  # lower-case names
    body: bytes


class Peer:
    """One accepted connection, seen from the server side."""

    def __init__(self, server: RawServer, index: int, reader, writer) -> None:
        self.server, self.index = server, index
        self.reader: asyncio.StreamReader = reader
        self.writer: asyncio.StreamWriter = writer
        self.requests: list[Request] = []
        self.gone = asyncio.Event()  # the client closed the connection

    async def read_request(self) -> Request | None:
        """The next request on this connection, ``None`` once the client has gone."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            self.gone.set()
            return None
        line, *fields = head.decode("latin-1").split("\r\n")[:-2]
        headers = {}
        for field in fields:
            name, _, value = field.partition(":")
            assert name.lower() not in headers, f"duplicate header {name}"
            headers[name.lower()] = value.strip()
        body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        req = Request(self.index, line, headers, body)
        self.requests.append(req)
        self.server.requests.append(req)
        return req

    async def send(self, *parts: bytes, pause: float = 0.0) -> None:
        """Write ``parts`` one after the other, ``pause`` seconds apart."""
        for i, part in enumerate(parts):
            if i and pause:
                await asyncio.sleep(pause)
            self.writer.write(part)
            await self.writer.drain()

    async def wait_eof(self, timeout: float = 1.0) -> bool:
        """Read (and drop) until the client closes the connection; whether it did within
        ``timeout`` seconds."""
        try:
            async with asyncio.timeout(timeout):
                while await self.reader.read(65536):
                    pass
        except TimeoutError:
            return False
        except ConnectionError:
            pass
        self.gone.set()
        return True

    def close(self) -> None:
        self.writer.close()

    def reset(self) -> None:
        """Close with a TCP RST instead of a FIN."""
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


Handler = Callable[[Peer], Awaitable[None]]


class RawServer:
    """``async with RawServer(handler) as srv``: a loopback server running ``handler`` for
    each connection; it counts connections and records the requests read."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1", tls=None) -> None:
        self.handler, self.host, self.tls = handler, host, tls
        self.peers: list[Peer] = []
        self.requests: list[Request] = []
        self.errors: list[BaseException] = []
        self._tasks: set[asyncio.Task] = set()

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, self.host, 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        name = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self.tls else "http"
        self.url = f"{scheme}://{name}:{self.port}{PATH}"
        return self

    async def __aexit__(self, *exc_info) -> None:
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        if self.errors and exc_info[0] is None:
            raise self.errors[0]

    @property
    def connections(self) -> int:
        return len(self.peers)

    async def _serve(self, reader, writer) -> None:
        peer = Peer(self, len(self.peers), reader, writer)
        self.peers.append(peer)
        self._tasks.add(asyncio.current_task())
        try:
            await self.handler(peer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        except Exception as exc:  # a broken handler must fail the test, not vanish
            self.errors.append(exc)
        finally:
            writer.close()


def response(
    body: bytes = b"",
    *headers: str,
    status: str = "200 OK",
    version: str = "HTTP/1.1",
    length: bool = True,
) -> bytes:
    """The exact bytes of a response; ``length=False`` leaves out Content-Length."""
    lines = [f"{version} {status}", *headers]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)


def echo(reply: Callable[[Request], bytes]) -> Handler:
    """A keep-alive handler answering each request with ``reply(request)``."""

    async def handler(peer: Peer) -> None:
        while (req := await peer.read_request()) is not None:
            await peer.send(reply(req))

    return handler


OK = echo(lambda req: response(b"ok"))


# -- the client side ------------------------------------------------------------------------
def run(coro: Awaitable, timeout: float = 5.0):
    """Run a test coroutine in a fresh event loop; a hang fails the test."""

    async def main():
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(main())


@contextlib.asynccontextmanager
async def client(**kwargs):
    up = Upstream(**kwargs)
    try:
        yield up
    finally:
        await up.aclose()
        await asyncio.sleep(0)  # let closed transports finish


async def read_all(resp: UpstreamResponse, timeout: float = 2.0) -> list[bytes]:
    """Every ``next()`` result up to the end; the response is closed whatever happens."""
    pieces = []
    try:
        while (chunk := await resp.next(timeout)) is not None:
            pieces.append(chunk)
    finally:
        await resp.aclose()
    return pieces


async def fetch(
    up: Upstream,
    url: str,
    body: bytes = BODY,
    *,
    timeouts: Timeouts = FAST,
    headers: dict | None = None,
    channel: str | None = None,
) -> bytes:
    resp = await up.open(url, body, timeouts=timeouts, extra_headers=headers, channel=channel)
    return b"".join(await read_all(resp, timeouts.idle))


async def closed_by_client(peer: Peer, timeout: float = 1.0) -> bool:
    """Whether the client has closed ``peer`` (the handler must be reading it)."""
    try:
        async with asyncio.timeout(timeout):
            await peer.gone.wait()
    except TimeoutError:
        return False
    return True


def pool_of(up: Upstream) -> http1.Pool:
    assert up._pool is not None
    return up._pool


# -- 1. keep-alive --------------------------------------------------------------------------
def test_sequential_requests_share_one_keep_alive_connection():
    async def main():
        async with RawServer(echo(lambda req: response(b"reply " + req.body))) as srv:
            async with client() as up:
                for i in range(20):
                    got = await fetch(
                        up,
                        srv.url + "?trace=1",
                        b'{"n":%03d}' % i,
                        headers={"authorization": "Bearer sk-123456789", "x-req": str(i)},
                    )
                    assert got == b'reply {"n":%03d}' % i
                assert pool_of(up).open_connections == 1
                assert pool_of(up).idle_connections() == 1
        assert srv.connections == 1
        assert len(srv.requests) == 20
        for i, req in enumerate(srv.requests):
            assert req.line == f"POST {PATH}?trace=1 HTTP/1.1"
            assert req.headers["host"] == f"127.0.0.1:{srv.port}"
            assert req.headers["content-length"] == str(len(req.body))
            assert req.headers["content-type"] == "application/json"
            assert req.headers["authorization"] == "Bearer sk-123456789"
            assert req.headers["x-req"] == str(i)
            assert req.body == b'{"n":%03d}' % i

    run(main())


def test_upstream_aclose_closes_idle_connections():
    async def main():
        async with RawServer(OK) as srv:
            up = Upstream()
            assert await fetch(up, srv.url) == b"ok"
            assert not srv.peers[0].gone.is_set()
            await up.aclose()
            assert await closed_by_client(srv.peers[0])

    run(main())


def test_pool_does_not_reuse_a_connection_idle_past_keepalive():
    async def main():
        async with RawServer(OK) as srv:
            origin, path = http1.split_url(srv.url)
            pool = http1.Pool(asyncio.get_running_loop(), keepalive=0.1)
            try:
                for _ in range(2):
                    conn = await pool.acquire(origin, 1.0)
                    conn.send(http1.request_head("POST", path, origin, {}, 0))
                    await conn.headers_of_response(1.0)
                    assert await conn.read(1.0) == b"ok" and await conn.read(1.0) is None
                    pool.release(conn)
                    await asyncio.sleep(0.2)
                assert srv.connections == 2
                assert await closed_by_client(srv.peers[0])  # the expired one was closed
            finally:
                pool.close()
                await asyncio.sleep(0)

    run(main())


# -- 2. connections the server closes while idle --------------------------------------------
def test_server_closing_after_each_response_does_not_fail_requests():
    async def one_then_close(peer: Peer) -> None:  # no Connection: close header
        if (req := await peer.read_request()) is not None:
            await peer.send(response(req.body))

    async def main():
        async with RawServer(one_then_close) as srv:
            async with client() as up:
                for i in range(5):
                    assert await fetch(up, srv.url, b"%d" % i) == b"%d" % i
        assert [r.body for r in srv.requests] == [b"0", b"1", b"2", b"3", b"4"]
        assert srv.connections == 5

    run(main())


@pytest.mark.parametrize("how", ["fin", "rst"])
def test_request_on_a_dropped_idle_connection_is_sent_again_on_a_new_one(how):
    async def handler(peer: Peer) -> None:
        if (req := await peer.read_request()) is not None:
            await peer.send(response(b"first " + req.body))
        if peer.index == 0 and await peer.read_request() is not None:
            peer.close() if how == "fin" else peer.reset()  # the idle connection died
            return
        while (req := await peer.read_request()) is not None:
            await peer.send(response(b"again " + req.body))

    async def main():
        async with RawServer(handler) as srv:
            async with client() as up:
                assert await fetch(up, srv.url, b"a") == b"first a"
                assert await fetch(up, srv.url, b"b") == b"first b"
        assert srv.connections == 2
        assert [r.body for r in srv.peers[0].requests] == [b"a", b"b"]  # b never answered
        assert [r.body for r in srv.peers[1].requests] == [b"b"]  # sent once more, once

    run(main())


def test_request_dropped_on_a_fresh_connection_is_not_sent_again():
    async def drop(peer: Peer) -> None:
        await peer.read_request()

    async def main():
        async with RawServer(drop) as srv:
            async with client() as up:
                with pytest.raises(UpstreamError) as ei:
                    await fetch(up, srv.url)
                assert not isinstance(ei.value, UpstreamTimeout)
        assert srv.connections == 1 and len(srv.requests) == 1

    run(main())


def test_retry_after_a_stale_connection_uses_a_fresh_one_not_another_idle_one():
    # Two idle connections that both turn out dead: the one retry must not take the second.
    async def handler(peer: Peer) -> None:
        if (req := await peer.read_request()) is not None:
            await asyncio.sleep(0.05)  # both first requests hold their own connection
            await peer.send(response(req.body))
        if peer.index < 2:  # any later request: the connection turns out to be dead
            await peer.read_request()
            return
        while (req := await peer.read_request()) is not None:
            await peer.send(response(req.body))

    async def main():
        async with RawServer(handler) as srv:
            async with client() as up:
                assert await asyncio.gather(fetch(up, srv.url, b"1"), fetch(up, srv.url, b"2"))
                assert pool_of(up).idle_connections() == 2
                assert await fetch(up, srv.url, b"3") == b"3"
        assert srv.connections == 3

    run(main())


# -- 3. chunked, close-delimited and Connection: close bodies --------------------------------
def test_chunked_body_streams_piece_by_piece_and_keeps_the_connection():
    events = [b"data: %d\n\n" % i for i in range(5)]

    async def main():
        first_seen = asyncio.Event()

        async def handler(peer: Peer) -> None:
            while await peer.read_request() is not None:
                head = response(b"", "Transfer-Encoding: chunked", length=False)
                await peer.send(head + chunked(events[0]))
                await first_seen.wait()  # the client has the first event before the rest exists
                await peer.send(
                    *[chunked(e) for e in events[1:]],
                    b"0\r\nX-Trailer: t\r\n\r\n",
                    pause=0.02,
                )

        async with RawServer(handler) as srv:
            async with client() as up:
                for _ in range(2):
                    first_seen.clear()
                    resp = await up.open(srv.url, BODY, timeouts=FAST)
                    assert resp.status == 200
                    assert await resp.next(1.0) == events[0]
                    first_seen.set()
                    pieces = await read_all(resp)
                    assert b"".join(pieces) == b"".join(events[1:])
                    assert len(pieces) >= 2  # delivered as it came, not at the end
        assert srv.connections == 1

    run(main())


def test_close_delimited_body_reads_to_the_end():
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        head = response(b"", "Content-Type: text/event-stream", length=False)
        await peer.send(head, b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n", pause=0.02)
        peer.close()

    async def main():
        async with RawServer(handler) as srv:
            async with client() as up:
                for _ in range(2):
                    got = await fetch(up, srv.url)
                    assert got == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
                    await asyncio.sleep(0)
                    assert pool_of(up).open_connections == 0
        assert srv.connections == 2

    run(main())


@pytest.mark.parametrize(
    "head",
    [("HTTP/1.1", "Connection: close"), ("HTTP/1.0",), ("HTTP/1.1", "connection: Close")],
    ids=["connection-close", "http-1.0", "lower-case"],
)
def test_response_that_ends_the_connection_is_not_reused(head):
    version, *headers = head
    # The server keeps the socket open regardless: the client alone must not reuse it.
    reply = echo(lambda req: response(req.body, *headers, version=version))

    async def main():
        async with RawServer(reply) as srv:
            async with client() as up:
                for i in range(3):
                    assert await fetch(up, srv.url, b"%d" % i) == b"%d" % i
                assert pool_of(up).open_connections == 0
                assert await closed_by_client(srv.peers[0])
        assert srv.connections == 3
        assert [len(p.requests) for p in srv.peers] == [1, 1, 1]

    run(main())


# -- 4. interim answers ---------------------------------------------------------------------
@pytest.mark.parametrize("apart", [False, True], ids=["one-write", "two-writes"])
def test_interim_answers_are_skipped(apart):
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
    final = response(b"hello", "X-Real: yes")

    async def handler(peer: Peer) -> None:
        while await peer.read_request() is not None:
            if apart:
                await peer.send(interim, final, pause=0.05)
            else:
                await peer.send(interim + final)

    async def main():
        async with RawServer(handler) as srv:
            async with client() as up:
                for _ in range(2):
                    resp = await up.open(srv.url, BODY, timeouts=FAST)
                    assert resp.status == 200
                    assert resp.headers["x-real"] == "yes" and "link" not in resp.headers
                    assert b"".join(await read_all(resp)) == b"hello"
        assert srv.connections == 1  # the final answer's end was seen: kept alive

    run(main())


# -- 5. failures ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "head, sent",
    [
        (response(b"", "Content-Length: 100", length=False), b"x" * 10),
        (response(b"", "Transfer-Encoding: chunked", length=False), chunked(b"x" * 10)),
    ],
    ids=["content-length", "chunked"],
)
def test_server_closing_mid_body_is_an_upstream_error(head, sent):
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(head, sent, pause=0.02)
        peer.close()

    async def main():
        async with RawServer(handler) as srv:
            async with client() as up:
                resp = await up.open(srv.url, BODY, timeouts=FAST)
                start = time.monotonic()
                with pytest.raises(UpstreamError) as ei:
                    await read_all(resp)
                assert not isinstance(ei.value, UpstreamTimeout)
                assert time.monotonic() - start < 1.0
                assert pool_of(up).open_connections == 0

    run(main())


def test_server_that_never_answers_times_out_at_first_byte():
    eof_seen = []

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        eof_seen.append(await peer.wait_eof(2.0))

    async def main():
        async with RawServer(handler) as srv:
            async with client() as up:
                start = time.monotonic()
                with pytest.raises(UpstreamTimeout):
                    await up.open(srv.url, BODY, timeouts=Timeouts(connect=1, first_byte=0.3))
                assert 0.25 < time.monotonic() - start < 1.0
                assert pool_of(up).open_connections == 0
                await asyncio.sleep(0.05)
        assert eof_seen == [True]  # the timed-out request was abandoned upstream

    run(main())


def test_body_that_stalls_times_out_on_idle():
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(response(b"", "Content-Length: 10", length=False), b"12345")
        await peer.wait_eof(2.0)

    async def main():
        async with RawServer(handler) as srv:
            async with client() as up:
                resp = await up.open(srv.url, BODY, timeouts=FAST)
                start = time.monotonic()
                with pytest.raises(UpstreamTimeout, match="mid-response"):
                    await read_all(resp, timeout=0.2)
                assert 0.15 < time.monotonic() - start < 1.0

    run(main())


def test_body_that_trickles_past_the_idle_timeout_then_stalls():
    """The idle timeout counts from the last bytes, not the first wait: bytes every 50 ms
    for longer than the 0.2 s idle timeout go through (the waits share one timer, moved
    on as they go), and the stall after them times out."""

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(response(b"", "Content-Length: 20", length=False), *[b"x"] * 12, pause=0.05)
        await peer.wait_eof(2.0)

    async def main():
        async with RawServer(handler) as srv:
            async with client() as up:
                resp = await up.open(srv.url, BODY, timeouts=FAST)
                got = b""
                with pytest.raises(UpstreamTimeout, match="mid-response"):
                    while (chunk := await resp.next(0.2)) is not None:
                        got += chunk
                assert got == b"x" * 12

    run(main())


@pytest.mark.parametrize(
    "answer",
    [
        b"hello\r\n\r\n",
        b"HTTP/1.1 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    ],
    ids=["no-status-line", "no-status", "bad-length", "two-lengths"],
)
def test_garbage_answer_is_an_upstream_error(answer):
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(answer)
        await peer.wait_eof(2.0)  # the client must decide by itself, not wait for a close

    async def main():
        async with RawServer(handler) as srv:
            async with client() as up:
                start = time.monotonic()
                with pytest.raises(UpstreamError) as ei:
                    await fetch(up, srv.url)
                assert not isinstance(ei.value, UpstreamTimeout)
                assert time.monotonic() - start < 1.0

    run(main())


def test_garbage_in_a_chunked_body_is_an_upstream_error():
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        head = response(b"", "Transfer-Encoding: chunked", length=False)
        await peer.send(head + chunked(b"fine"), b"zz\r\nnot a chunk\r\n", pause=0.02)
        await peer.wait_eof(2.0)

    async def main():
        async with RawServer(handler) as srv:
            async with client() as up:
                resp = await up.open(srv.url, BODY, timeouts=FAST)
                with pytest.raises(UpstreamError) as ei:
                    await read_all(resp)
                assert not isinstance(ei.value, UpstreamTimeout)

    run(main())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_refused_is_an_upstream_error_and_frees_the_slot():
    async def main():
        url = f"http://127.0.0.1:{free_port()}{PATH}"
        async with RawServer(OK) as srv:
            async with client(max_connections=1) as up:
                for _ in range(3):
                    with pytest.raises(UpstreamError) as ei:
                        await fetch(up, url)
                    assert not isinstance(ei.value, UpstreamTimeout)
                    assert pool_of(up).open_connections == 0
                assert await fetch(up, srv.url) == b"ok"

    run(main())


@pytest.mark.parametrize("url", ["ftp://example.com/v1", "http:///v1", "example.com/v1"])
def test_url_that_is_not_http_is_a_non_retryable_upstream_error(url):
    async def main():
        async with client() as up:
            with pytest.raises(UpstreamError) as ei:
                await fetch(up, url)
            assert ei.value.retryable is False

    run(main())


# -- 6. error statuses ----------------------------------------------------------------------
def test_error_status_raises_upstream_status_with_its_head_and_scrubbed_body():
    secret = "sk-live-0123456789abcdef"
    body = b'{"error": {"message": "no, ' + secret.encode() + b'"}}'
    answer = response(body, "Retry-After: 7", status="503 Service Unavailable")

    async def main():
        async with RawServer(echo(lambda req: answer)) as srv:
            async with client() as up:
                with pytest.raises(UpstreamStatus) as ei:
                    await fetch(up, srv.url, headers={"authorization": f"Bearer {secret}"})
                # the error's connection is not left counted
                assert pool_of(up).open_connections == 0
        err = ei.value
        assert isinstance(err, UpstreamError) and err.upstream_status == 503
        assert err.headers.get("retry-after") == "7"
        assert err.body == b'{"error": {"message": "no, <redacted>"}}'
        assert secret not in err.message

    run(main())


# -- 7. flow control ------------------------------------------------------------------------
def test_large_body_is_read_whole_with_reading_paused_while_unread():
    size = 5 * 1024 * 1024
    data = bytes(range(256)) * (size // 256)

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        head = response(b"", f"Content-Length: {size}", length=False)
        await peer.send(head, *[data[i : i + 65536] for i in range(0, size, 65536)])
        await peer.wait_eof(2.0)

    async def main():
        async with RawServer(handler) as srv:
            async with client() as up:
                resp = await up.open(srv.url, BODY, timeouts=FAST)
                await asyncio.sleep(0.3)  # nothing read: the client must stop reading
                conn = resp._conn
                assert conn.paused
                assert 1 << 20 < conn.buffered < 2 << 20
                pieces = await read_all(resp)
                assert b"".join(pieces) == data
                assert len(pieces) > 2
                assert pool_of(up).idle_connections() == 1  # complete: kept alive

    run(main())


# -- 8. abandoning a response ---------------------------------------------------------------
def test_aclose_on_an_unfinished_response_closes_its_connection():
    eof_after = []

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        if peer.index == 0:
            await peer.send(response(b"", "Content-Length: 1000", length=False), b"x" * 10)
            start = time.monotonic()
            if await peer.wait_eof(1.0):
                eof_after.append(time.monotonic() - start)
        else:
            await peer.send(response(b"second"))

    async def main():
        async with RawServer(handler) as srv:
            async with client() as up:
                resp = await up.open(srv.url, BODY, timeouts=FAST)
                assert await resp.next(1.0) == b"x" * 10
                await resp.aclose()
                await resp.aclose()  # twice is harmless
                assert pool_of(up).open_connections == 0
                await asyncio.sleep(0.05)
                assert len(eof_after) == 1 and eof_after[0] < 0.5
                assert await fetch(up, srv.url) == b"second"
        assert srv.connections == 2

    run(main())


# -- 9. the connection cap ------------------------------------------------------------------
def _holding(hold: float) -> Handler:
    """Answers the first two requests after ``hold`` seconds, any later one at once."""
    seen = []

    async def handler(peer: Peer) -> None:
        while (req := await peer.read_request()) is not None:
            seen.append(req)
            if len(seen) <= 2:
                await asyncio.sleep(hold)
            await peer.send(response(req.body))

    return handler


async def _timed(coro: Awaitable) -> tuple[float, object]:
    """(seconds taken, the result or the UpstreamError raised)."""
    start = time.monotonic()
    try:
        result = await coro
    except UpstreamError as exc:
        result = exc
    return time.monotonic() - start, result


def test_request_over_the_connection_cap_waits_for_a_free_connection():
    async def main():
        async with RawServer(_holding(0.3)) as srv:
            async with client(max_connections=2) as up:
                results = await asyncio.gather(
                    *[_timed(fetch(up, srv.url, b"%d" % i)) for i in range(3)]
                )
        assert [got for _, got in results] == [b"0", b"1", b"2"]
        assert results[2][0] >= 0.28  # it waited for one of the held ones
        assert srv.connections == 2

    run(main())


def test_request_over_the_connection_cap_times_out_after_connect_timeout():
    async def main():
        timeouts = Timeouts(connect=0.1, first_byte=2.0, idle=2.0)
        async with RawServer(_holding(0.5)) as srv:
            async with client(max_connections=2) as up:
                results = await asyncio.gather(
                    *[_timed(fetch(up, srv.url, b"%d" % i, timeouts=timeouts)) for i in range(3)]
                )
                assert [got for _, got in results[:2]] == [b"0", b"1"]
                elapsed, err = results[2]
                assert isinstance(err, UpstreamTimeout), err
                assert "connect" in err.message
                # the connect timeout, not the hold: a wait for the hold would have ended in
                # an answer, not this error
                assert elapsed >= 0.09
                # the pool is consistent afterwards: two idle, and both usable
                assert pool_of(up).open_connections == 2
                assert await asyncio.gather(fetch(up, srv.url, b"3"), fetch(up, srv.url, b"4"))
        assert srv.connections == 2

    run(main())


def test_idle_connection_to_another_origin_gives_way_at_the_cap():
    # At max_connections, a slot held by an idle connection elsewhere is freed, not waited on.
    async def main():
        async with RawServer(OK) as a, RawServer(OK) as b:
            async with client(max_connections=1) as up:
                assert await fetch(up, a.url) == b"ok"  # its connection now sits idle
                timeouts = Timeouts(connect=0.5, first_byte=2.0, idle=2.0)
                assert await fetch(up, b.url, timeouts=timeouts) == b"ok"

    run(main())


def test_an_upstreams_own_cap_queues_its_requests_and_not_other_upstreams():
    # Upstream.limit: at most one connection to a; b, not capped, is not held up by it.
    async def main():
        async with RawServer(_holding(0.3)) as a, RawServer(OK) as b:
            async with client(max_connections=10) as up:
                up.limit(a.url, max_connections=1, keepalive=None)
                slow = asyncio.gather(*[fetch(up, a.url, b"%d" % i) for i in range(3)])
                await asyncio.sleep(0.05)
                assert pool_of(up).open_connections == 1  # the other two wait for it
                assert await fetch(up, b.url) == b"ok"  # meanwhile
                assert await slow == [b"0", b"1", b"2"]
        assert a.connections == 1 and b.connections == 1

    run(main())


def test_two_channels_on_one_upstream_each_keep_their_own_cap():
    # Channel x may open one connection to a, channel y two: each reaches its own cap,
    # neither overrides the other's (the cap was keyed by host and port: the last won).
    async def main():
        async with RawServer(_holding(0.3)) as a:
            async with client(max_connections=10) as up:
                up.limit(a.url, max_connections=1, keepalive=None, channel="x")
                up.limit(a.url, max_connections=2, keepalive=None, channel="y")
                xs = [fetch(up, a.url, b"x%d" % i, channel="x") for i in range(3)]
                ys = [fetch(up, a.url, b"y%d" % i, channel="y") for i in range(3)]
                assert await asyncio.gather(*xs, *ys) == [b"x0", b"x1", b"x2", b"y0", b"y1", b"y2"]
        # x's one connection and y's two (one cap for both: 2 in all; none: 6).
        assert a.connections == 3

    run(main())


def test_idle_connections_are_closed_by_a_timer_after_their_upstreams_keep_alive():
    # Nothing else happens on the pool: a's idle connection is closed by the client all
    # the same (before the upstream's own keep-alive would), b's longer one is kept.
    async def main():
        async with RawServer(OK) as a, RawServer(OK) as b:
            async with client(keepalive=30.0) as up:
                up.limit(a.url, max_connections=None, keepalive=0.1)
                assert await fetch(up, a.url) == b"ok"
                assert await fetch(up, b.url) == b"ok"
                assert pool_of(up).idle_connections() == 2
                assert await closed_by_client(a.peers[0])
                assert pool_of(up).open_connections == 1  # b's, kept
                assert not b.peers[0].gone.is_set()
                assert await fetch(up, a.url) == b"ok"  # a new one is made after
        assert a.connections == 2 and b.connections == 1

    run(main())


# -- 10. header injection -------------------------------------------------------------------
@pytest.mark.parametrize(
    "headers",
    [
        {"x-evil": "a\r\nInjected: 1"},
        {"x-evil": "a\nInjected: 1"},
        {"x-evil": "a\rInjected: 1"},
        {"x-evil\r\nInjected": "1"},
        {"x-evil: 1\r\nInjected": "1"},
        {"x-name:with-colon": "1"},
        {"x-snowman": "\u2603"},
    ],
    ids=["crlf", "lf", "cr", "name-crlf", "name-colon-crlf", "name-colon", "not-latin-1"],
)
def test_header_that_could_inject_is_refused_before_sending(headers):
    async def main():
        async with RawServer(OK) as srv:
            async with client() as up:
                with pytest.raises(UpstreamError) as ei:
                    await fetch(up, srv.url, headers=headers)
                assert ei.value.retryable is False
                await asyncio.sleep(0.05)
        assert srv.connections == 0 and srv.requests == []

    run(main())


# -- 11. URLs and Host headers --------------------------------------------------------------
@pytest.mark.parametrize(
    "url, key, host_header, path",
    [
        ("http://example.com/v1/x", ("http", "example.com", 80), "example.com", "/v1/x"),
        ("http://Example.COM", ("http", "example.com", 80), "example.com", "/"),
        (
            "http://example.com:8000/v1?a=1&b=2",
            ("http", "example.com", 8000),
            "example.com:8000",
            "/v1?a=1&b=2",
        ),
        ("http://example.com:443/", ("http", "example.com", 443), "example.com:443", "/"),
        ("https://example.com/v1", ("https", "example.com", 443), "example.com", "/v1"),
        ("https://example.com:443/v1", ("https", "example.com", 443), "example.com", "/v1"),
        ("https://example.com:80/", ("https", "example.com", 80), "example.com:80", "/"),
        ("http://10.0.0.7:8000/v1", ("http", "10.0.0.7", 8000), "10.0.0.7:8000", "/v1"),
        ("http://[::1]:8080/v1", ("http", "::1", 8080), "[::1]:8080", "/v1"),
        ("http://[::1]/v1", ("http", "::1", 80), "[::1]", "/v1"),
        ("https://[2001:db8::1]/", ("https", "2001:db8::1", 443), "[2001:db8::1]", "/"),
        ("https://[2001:db8::1]:8443", ("https", "2001:db8::1", 8443), "[2001:db8::1]:8443", "/"),
    ],
)
def test_split_url_and_host_header(url, key, host_header, path):
    origin, got_path = http1.split_url(url)
    assert origin.key == key
    assert (origin.scheme, origin.host, origin.port) == key
    assert origin.tls == (key[0] == "https")
    assert origin.host_header == host_header
    assert got_path == path
    head = http1.request_head("POST", got_path, origin, {"x-a": 1}, 3).decode()
    assert head == (
        f"POST {path} HTTP/1.1\r\nHost: {host_header}\r\nx-a: 1\r\nContent-Length: 3\r\n\r\n"
    )


@pytest.mark.parametrize(
    "url", ["ftp://example.com/", "http:///v1", "example.com:80/v1", "http://example.com:99999/"]
)
def test_split_url_refuses_what_is_not_an_http_url(url):
    with pytest.raises(ValueError):
        http1.split_url(url)


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback")
def test_ipv6_literal_upstream():
    async def main():
        async with RawServer(OK, host="::1") as srv:
            async with client() as up:
                assert await fetch(up, srv.url) == b"ok"
        assert srv.requests[0].headers["host"] == f"[::1]:{srv.port}"

    run(main())


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (openssl, as on every test machine)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = self_signed(tmp_path_factory.mktemp("tls"), "cert", "127.0.0.1")
    return cert, key


def test_https_upstream_is_verified_and_kept_alive(certificate):
    cert, key = certificate
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    trusting = ssl.create_default_context(cafile=str(cert))

    async def main():
        async with RawServer(OK, tls=server_tls) as srv:
            assert srv.url.startswith("https://")
            async with client(ssl_context=trusting) as up:
                assert [await fetch(up, srv.url) for _ in range(3)] == [b"ok"] * 3
            assert srv.connections == 1  # kept alive over TLS
            async with client() as up:  # the system's CAs: the self-signed one is refused
                with pytest.raises(UpstreamError, match="cannot reach upstream"):
                    await fetch(up, srv.url)

    run(main())
