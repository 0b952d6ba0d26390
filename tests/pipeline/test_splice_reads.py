"""The splice (``pipeline/splice.py``) against the pumped relay: it feeds its relay once a
read, with all the HTTP chunks that read brought, and writes through the server's
connection's ``write_chunk`` once the head is out; on generated streams (those of test_relay_templates.py, their events
grouped into reads of one to four HTTP chunks), the client's body, de-chunked strictly,
is the bytes the relay gives when fed one chunk at a time, and the record is the same.
The same holds through a real upstream connection whose transport's protocol the splice
becomes, and then for its lane (a read that is one chunk of the relay's template, taken
by the splice itself): a chunk a read, a long stream's reads past the connection once its
template is learned, a client that fills its buffer, one closed or lost."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixgate.apis.chat.endpoint import ENDPOINT as CHAT
from prefixgate.apis.chat.steps import ChatRelay
from prefixgate.pipeline.splice import Splice
from prefixgate.serve.httpserver import HTTPProtocol, _Request
from prefixgate.upstream import http1
from prefixgate.upstream.transport import FakeReply
from tests.pipeline.test_relay_templates import _relays, _run, _shape, same_ids, streams
from tests.pipeline.test_relays import MSG, _exchange
from tests.upstream.test_chunk_reads import HEAD, _framed
from tests.upstream.test_chunk_reads import _Transport as _UpstreamTransport


class _Transport:
    def __init__(self, wire: list[bytes]) -> None:
        self.write = wire.append
        self.closing = False

    def close(self) -> None:
        self.closing = True


class _ClientConn:
    """The server's side of the client's connection, as a request writes to it."""

    closed = write_paused = False
    on_resume = on_pause = _drain = None
    write_chunk = HTTPProtocol.write_chunk  # (the server's own framing)
    write_framed = HTTPProtocol.write_framed
    pause_writing = HTTPProtocol.pause_writing
    resume_writing = HTTPProtocol.resume_writing
    close = HTTPProtocol.close

    def __init__(self, loop) -> None:
        self.loop, self.wire = loop, []
        self.transport = _Transport(self.wire)
        self.write = self.wire.append

    def request_done(self, req) -> None:
        pass


class _UpstreamConn:
    """The upstream connection's side of a splice: its sink fed read by read, each
    read's HTTP chunks in ``chunks`` (as the parser appends them)."""

    complete = closed = paused = False
    error = transport = poller = None

    def __init__(self, loop) -> None:
        self.loop = loop
        self.chunks: collections.deque[bytes] = collections.deque()

    def attach(self, sink) -> None:
        sink.flush()

    def detach(self) -> None:
        pass

    def hold(self, on: bool) -> None:
        pass


def _dechunk(wire: bytes) -> bytes:
    """A chunked body decoded strictly: every size line matches its chunk, a CRLF after
    each, the zero chunk last."""
    head, _, rest = wire.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
    body = b""
    while True:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            assert rest == b"\r\n"
            return body
        assert rest[n : n + 2] == b"\r\n"
        body, rest = body + rest[:n], rest[n + 2 :]


def _spliced(relay, groups: list[list[bytes]]) -> bytes:
    loop = asyncio.new_event_loop()
    try:
        client = _ClientConn(loop)
        req = _Request(client, {"method": "POST", "http_version": "1.1"}, True)
        req.start(200, [(b"content-type", b"text/event-stream")])
        up = _UpstreamConn(loop)
        sp = Splice(relay, req, up, 60.0)
        up.chunks.append(groups[0][0])  # x.first, as run() takes it
        up.attach(sp)
        for group in groups[1:]:
            up.chunks.extend(group)  # one HTTP chunk each, in one read
            sp.flush()
        up.complete = True
        sp.news()
        if sp.timer is not None:
            sp.timer.cancel()
        return b"".join(client.wire)
    finally:
        loop.close()


@contextlib.contextmanager
def _connection_reads():
    """The reads that reach the upstream connection meanwhile (not the splice's lane)."""
    reads: list[bytes] = []
    inner = http1.Connection.data_received

    def counted(self, data: bytes) -> None:
        reads.append(data)
        inner(self, data)

    with mock.patch.object(http1.Connection, "data_received", counted):
        yield reads


def _begun(relay, client, first: bytes, transport=None) -> tuple[Splice, http1.Connection]:
    """A splice begun on a real upstream connection (over ``transport``) whose response
    head and first chunk (``first``) came in one read, for the server's request on
    ``client``."""
    req = _Request(client, {"method": "POST", "http_version": "1.1"}, True)
    req.start(200, [(b"content-type", b"text/event-stream")])
    up = http1.Connection(http1.Pool(client.loop), http1.Origin("http", "127.0.0.1", 80))
    up.connection_made(transport or _UpstreamTransport())
    up.send(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
    up.data_received(HEAD + _framed(first))
    sp = Splice(relay, req, up, 60.0)
    sp.raw.appendleft(up.take())  # x.first, as run() takes it
    sp.begin()
    assert up.transport.protocol is sp  # every read comes to the splice first
    return sp, up


def _spliced_by_connection(relay, groups: list[list[bytes]]) -> bytes:
    """The same through a real upstream connection: each group one read of its chunks,
    framed as an engine frames them (a read of one chunk framed by the connection itself,
    ``tests/upstream/test_chunk_reads.py``), each read given to the transport's protocol
    (the splice, whose lane takes a read that is one chunk of its relay's template), then
    the body's end."""
    loop = asyncio.new_event_loop()
    try:
        client = _ClientConn(loop)
        sp, up = _begun(relay, client, groups[0][0])
        for group in groups[1:]:
            up.transport.protocol.data_received(b"".join(_framed(chunk) for chunk in group))
        up.transport.protocol.data_received(b"0\r\n\r\n")
        assert up.complete and sp.ended
        sp._stop()
        assert up.transport.protocol is up
        return b"".join(client.wire)
    finally:
        loop.close()


@pytest.mark.parametrize("kind", ["chat", "messages", "responses"])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(), data=st.data())
def test_a_splice_fed_once_a_read_sends_what_the_relay_gives_a_chunk_at_a_time(
    kind, stream, data
) -> None:
    model, reads = stream
    cuts = data.draw(st.lists(st.integers(1, 4), min_size=len(reads), max_size=len(reads)))
    groups, i = [[reads[0]]], 1
    for n in cuts:
        if i >= len(reads):
            break
        groups.append(reads[i : i + n])
        i += n
    results = []
    for spliced in ("flushed", "connection", False):
        with same_ids():
            relay = _relays(kind, model, reads, True)
            if spliced == "flushed":
                body = _dechunk(_spliced(relay, groups))
            elif spliced == "connection":
                body = _dechunk(_spliced_by_connection(relay, groups))
            else:
                got = _run(relay, reads)
                parts = [g[2] if isinstance(g, tuple) and len(g) == 3 else g for g in got[:-1]]
                body = b"".join(parts)
            rec = relay.rec
            results.append((body, rec.status, rec.prompt_tokens, rec.completion_tokens))
    assert results[0] == results[1] == results[2]
    assert list(itertools.chain.from_iterable(groups)) == reads


@pytest.mark.parametrize("kind", ["chat", "messages", "responses"])
def test_what_a_streams_every_read_touches_keeps_its_attributes_in_slots(kind) -> None:
    """At a thousand streams each read finds its stream's objects gone from the CPU's
    caches, and an object's attributes in a dict of their own are one more miss
    (``benchmarks/relay_chunks.py --interleave 1000 --misses``): the relay, its converter,
    the splice, the server's request and connection and the upstream connection have
    none, and the first byte's time is set once, by the first read that makes output."""
    from prefixgate.upstream.http1 import Connection

    reads = [b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n']
    relay = _relays(kind, "m", reads, True)
    loop = asyncio.new_event_loop()
    try:
        client = _ClientConn(loop)
        req = _Request(client, {"method": "POST", "http_version": "1.1"}, True)
        up = _UpstreamConn(loop)
        touched = [relay, getattr(relay, "conv", relay), Splice(relay, req, up, 60.0), req]
    finally:
        loop.close()
    for obj in touched:
        assert not hasattr(obj, "__dict__"), type(obj).__name__
    for cls in (HTTPProtocol, Connection):
        assert "__dict__" not in dir(cls) and "__slots__" in vars(cls), cls.__name__
    assert relay.timing and relay.rec.first_byte_at is None
    relay.feed(reads[0])
    first = relay.rec.first_byte_at
    assert first is not None and not relay.timing
    relay.feed(reads[0])
    assert relay.rec.first_byte_at == first


def _pumped(relay, reads: list[bytes]) -> bytes:
    got = _run(relay, reads)
    return b"".join(g[2] if isinstance(g, tuple) and len(g) == 3 else g for g in got[:-1])


def _swapping_chat(upstream_model: str) -> ChatRelay:
    """A chat relay whose upstream names the model otherwise than the client did (the
    name swapped in each chunk's bytes)."""
    body = {**MSG, "model": "public-name", "stream_options": {"include_usage": True}}
    x, _, _ = _exchange(CHAT, body, FakeReply.sse(b"{}"))
    x.out["model"] = upstream_model
    return ChatRelay(x)


def _relay(kind: str, model: str, reads: list[bytes]):
    return _swapping_chat(model) if kind == "chat-swapped" else _relays(kind, model, reads, True)


@pytest.mark.parametrize("kind", ["chat", "chat-swapped", "messages", "responses"])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams())
def test_the_lane_sends_what_the_relay_gives_a_read_at_a_time(kind, stream) -> None:
    """Every read one chunk (the lane's reads): the client's body and the record are
    the pumped relay's, odd pieces (escapes, invalid bytes, key-like strings) included."""
    model, reads = stream
    results = []
    for spliced in (True, False):
        with same_ids():
            relay = _relay(kind, model, reads)
            if spliced:
                body = _dechunk(_spliced_by_connection(relay, [[r] for r in reads]))
            else:
                body = _pumped(relay, reads)
            rec = relay.rec
            results.append((body, rec.status, rec.prompt_tokens, rec.completion_tokens))
    assert results[0] == results[1]


# Pieces as an upstream may write them: plain, escaped as msgspec escapes, escaped
# otherwise (a \u escape of a printable letter, an escaped solidus: a converter that
# encodes the piece again writes them otherwise), and one that spells a key.
_TOKENS = [
    b'"Hello"',
    b'" wor"',
    b'"\\n"',
    b'" caf\\u00e9"',
    b'" \\"q\\""',
    b'"a\\/b"',
    b'"usage"',
    b'" 42"',
]


def _long(engine: str, model: str, n: int, key: str = "content") -> list[bytes]:
    datas = [_shape(engine, model, {"role": "assistant", "content": ""})]
    cut = _shape(engine, model, {key: "TOKEN"})
    datas += [cut.replace(b'"TOKEN"', _TOKENS[i % len(_TOKENS)]) for i in range(n)]
    usage = {"prompt_tokens": 9, "completion_tokens": n, "total_tokens": 9 + n}
    datas += [_shape(engine, model, {}, "stop"), _shape(engine, model, None, usage=usage)]
    return [b"data: " + d + b"\n\n" for d in [*datas, b"[DONE]"]]


@pytest.mark.parametrize(
    ("kind", "engine"),
    [("chat", "vllm"), ("chat-swapped", "vllm"), ("messages", "vllm"), ("messages", "sglang")],
)
def test_once_learned_a_streams_reads_go_by_the_lane(kind, engine) -> None:
    """A long stream, a chunk a read: after the first few (the template learned, the
    first byte's time set, the block opened) no read reaches the upstream connection
    but the last three (the finish, the usage, [DONE]), and the client gets the same.
    (SGLang's chat chunks each name ``usage``: the chat relay decodes every one.)"""
    reads = _long(engine, "up/m-1", 60)
    with same_ids():
        relay = _relay(kind, "up/m-1", reads)
        with _connection_reads() as seen:
            spliced = _dechunk(_spliced_by_connection(relay, [[r] for r in reads]))
    with same_ids():
        assert spliced == _pumped(_relay(kind, "up/m-1", reads), reads)
    # the head with the first read; then the reads of the pieces until the template is
    # learned and taken once by the relay; the finish, the usage and [DONE]; the end
    # (and in chat, each piece that spells a key: the relay's search would stop at it)
    keys = 60 // len(_TOKENS) + 1 if kind.startswith("chat") else 0
    assert 4 <= len(seen) <= 10 + keys, len(seen)
    assert seen[-1] == b"0\r\n\r\n"
    if kind == "chat-swapped":
        assert b'"model":"public-name"' in spliced and b"up/m-1" not in spliced


class _PausingTransport:
    """The client's transport: full (its protocol told to pause writing, inside the
    write, as a transport does) once ``room`` bytes were written."""

    def __init__(self, conn, room: int) -> None:
        self.conn, self.room, self.wire = conn, room, []

    def write(self, data: bytes) -> None:
        self.wire.append(data)
        if sum(map(len, self.wire)) > self.room and not self.conn.write_paused:
            self.conn.pause_writing()


def test_a_client_that_fills_its_buffer_closes_the_lane_and_holds_the_upstream() -> None:
    reads = _long("vllm", "m", 80)
    loop = asyncio.new_event_loop()
    try:
        client = _ClientConn(loop)
        tr = client.transport = _PausingTransport(client, 4000)
        client.write = tr.write
        held: list[bool] = []
        transport = _UpstreamTransport()
        transport.pause_reading = lambda: held.append(True)
        transport.resume_reading = lambda: held.append(False)
        with same_ids():
            sp, up = _begun(_relays("chat", "m", reads, True), client, reads[0], transport)
            i = 1
            while not held and i < len(reads):
                transport.protocol.data_received(_framed(reads[i]))
                i += 1
            assert held == [True] and up.paused and sp.head is None  # the lane closed
            assert client.on_resume is not None
            # (an upstream that sends on while paused: what it sent is still relayed)
            transport.protocol.data_received(_framed(reads[i]))
            i += 1
            tr.room = 10**9
            client.resume_writing()
            assert held == [True, False] and not up.paused and sp.head is not None
            for r in reads[i:]:
                transport.protocol.data_received(_framed(r))
            transport.protocol.data_received(b"0\r\n\r\n")
            assert sp.ended
            sp._stop()
            assert client.on_pause is None and client.on_resume is None
        with same_ids():
            assert _dechunk(b"".join(tr.wire)) == _pumped(_relays("chat", "m", reads, True), reads)
    finally:
        loop.close()


@pytest.mark.parametrize("how", ["closed", "lost"])
def test_a_client_gone_closes_the_lane_and_nothing_more_is_written(how) -> None:
    reads = _long("vllm", "m", 40)
    loop = asyncio.new_event_loop()
    try:
        client = _ClientConn(loop)
        sp, up = _begun(_relays("chat", "m", reads, True), client, reads[0])
        transport = up.transport
        for r in reads[1:20]:
            transport.protocol.data_received(_framed(r))
        assert sp.head is not None
        written = len(client.wire)
        if how == "closed":  # by the server (its shutdown, the edge sweep)
            client.close()
            assert client.transport.closing
        else:
            client.closed = True
            client.on_pause()  # (what HTTPProtocol.connection_lost does)
        assert sp.head is None
        for r in reads[20:30]:
            transport.protocol.data_received(_framed(r))
        assert len(client.wire) == written
    finally:
        loop.close()
