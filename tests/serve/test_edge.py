"""The bounded edge (``serve/edge.py``) on both HTTP servers the gateway runs on, driven
with raw sockets against a real ``prefixgate serve`` process: ``--http prefixgate`` (its
own) and ``--http uvicorn``.

Deadlines are configured short (half a second) so that a late head or body is refused
while the test watches; the tests assert what the client gets (408, 400, 431, 503, a
closed connection), never how long it took."""

from __future__ import annotations

import json
import select
import socket

import pytest

from tests.serve.served import Served
from tests.serve.test_httpserver import Conn, request

IMPLS = ["prefixgate", "uvicorn"]
WAIT = 15.0  # for what must happen within a deadline of the server's: a hang fails
SHORT = {"head_timeout": 0.5, "body_timeout": 0.5, "body_min_rate": 1000}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module", params=IMPLS)
def short(request, tmp_path_factory):
    """A gateway with half-second deadlines."""
    with Served(tmp_path_factory.mktemp("short"), {"server": SHORT}, "--http", request.param) as s:
        yield s


@pytest.fixture(scope="module", params=IMPLS)
def capped(request, tmp_path_factory):
    """A gateway that takes 3 connections at most, with the default deadlines."""
    config = {"server": {"max_connections": 3}}
    with Served(tmp_path_factory.mktemp("capped"), config, "--http", request.param) as s:
        yield s


def trickle(c: Conn, data: bytes, gap: float = 0.1) -> None:
    """Send ``data`` a byte every ``gap`` seconds until the server answers or closes."""
    for i in range(len(data)):
        try:
            c.sock.sendall(data[i : i + 1])
        except (BrokenPipeError, ConnectionResetError):
            return
        readable, _, _ = select.select([c.sock], [], [], gap)
        if readable:
            return
    raise AssertionError("the server took the whole trickle")


def post(path: str, body: dict, headers: tuple = ()) -> bytes:
    return request(
        "POST", path, (("Content-Type", "application/json"), *headers), json.dumps(body).encode()
    )


def test_a_normal_request_is_served(short):
    with Conn(short.port, timeout=WAIT) as c:
        c.send(post("/v1/chat/completions", CHAT))
        assert c.read_response().status == 200


LATE = "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"


@pytest.mark.parametrize(
    "first, trickled, said",
    [
        (LATE + "X-Slow: ", b"a" * 1000, b"the request head did not arrive"),
        (LATE + "Content-Length: 100\r\n\r\n", b"", b"no byte of the request body came"),
        # 10 bytes/s: never idle, far below the floor of 1000 bytes/s
        (LATE + "Content-Length: 100000\r\n\r\n", b" " * 100_000, b"slower than 1000"),
    ],
    ids=["head-trickled", "body-stopped", "body-under-the-rate-floor"],
)
def test_a_request_still_arriving_at_its_deadline_gets_408_and_is_closed(
    short, first, trickled, said
):
    with Conn(short.port, timeout=WAIT) as c:
        c.send(first.encode())
        if trickled:
            trickle(c, trickled)
        r = c.read_response()
        assert r.status == 408 and said in r.body, r.body
        assert c.wait_closed(WAIT) == b""


@pytest.mark.parametrize(
    "head",
    [
        b"GET /healthz HTTP/1.1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"GET /healthz HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n",
    ],
    ids=["no-host", "two-hosts", "two-hosts-http10"],
)
def test_host_missing_or_twice_gets_400_and_close(short, head):
    with Conn(short.port, timeout=WAIT) as c:
        c.send(head)
        r = c.read_response()
        assert r.status == 400 and b"Host" in r.body
        assert c.wait_closed(WAIT) == b""


def test_http10_without_host_is_served(short):
    with Conn(short.port, timeout=WAIT) as c:
        c.send(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert c.read_response().status == 200


def test_an_endless_header_line_is_refused_at_the_bound(short):
    sent = 0
    with Conn(short.port, timeout=WAIT) as c:
        c.send(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Endless: ")
        piece = b"a" * 65536
        try:
            while sent < 256 * 1024 * 1024:
                c.sock.sendall(piece)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass
        # Refused past ~1 MiB; the rest is what the socket buffers took meanwhile.
        assert sent < 32 * 1024 * 1024, "the server kept reading the endless line"
        try:
            r = c.read_response()
        except (EOFError, ConnectionResetError):
            r = None  # the 431 was lost to the reset of the bytes still in flight
        assert r is None or r.status == 431


def test_past_the_connection_cap_a_client_gets_its_routes_overloaded_answer(capped):
    held = [Conn(capped.port, timeout=WAIT) for _ in range(3)]
    try:
        for c in held:  # each counted: served once
            c.send(request("GET", "/healthz"))
            assert c.read_response().status == 200
        with Conn(capped.port, timeout=WAIT) as c:
            c.send(post("/v1/messages", {"model": "m", "max_tokens": 1, "messages": []}))
            r = c.read_response()
            assert r.status == 529 and r.header("retry-after") == "1"  # as admission's
            assert r.header("connection") == "close"
            err = json.loads(r.body)
            assert err["type"] == "error" and err["error"]["type"] == "overloaded_error"
            assert "connection limit (3)" in err["error"]["message"]
            assert c.wait_closed(WAIT) == b""
        with Conn(capped.port, timeout=WAIT) as c:
            c.send(post("/v1/chat/completions", CHAT))
            r = c.read_response()
            assert r.status == 503 and json.loads(r.body)["error"]["code"] == "overloaded"
    finally:
        for c in held:
            c.close()
    served = None
    for _ in range(200):  # until the server has seen the three go
        with Conn(capped.port, timeout=WAIT) as c:
            c.send(post("/v1/chat/completions", CHAT))
            served = c.read_response().status
        if served == 200:
            break
    assert served == 200


def test_far_past_the_cap_a_connection_is_closed_unanswered(capped):
    held = []
    try:
        for _ in range(3 + 16):  # the cap, and the refused ones it answers
            held.append(socket.create_connection(("127.0.0.1", capped.port)))
        with Conn(capped.port, timeout=WAIT) as c:
            c.send_until_reset(request("GET", "/healthz"))
            assert c.wait_closed(WAIT) == b""
    finally:
        for s in held:
            s.close()
