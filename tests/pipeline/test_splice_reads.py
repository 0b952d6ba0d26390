"""The splice (``pipeline/splice.py``) against the pumped relay: it feeds its relay once a
read, with all the HTTP chunks that read brought, and writes through the server's
connection's ``write_chunk`` once the head is out; on generated streams (those of test_relay_templates.py, their events
grouped into reads of one to four HTTP chunks), the client's body, de-chunked strictly,
is the bytes the relay gives when fed one chunk at a time, and the record is the same."""

from __future__ import annotations

import asyncio
import collections
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixgate.pipeline.splice import Splice
from prefixgate.serve.httpserver import HTTPProtocol, _Request
from prefixgate.upstream import http1
from tests.pipeline.test_relay_templates import _relays, _run, same_ids, streams
from tests.upstream.test_chunk_reads import HEAD, _framed
from tests.upstream.test_chunk_reads import _Transport as _UpstreamTransport


class _Transport:
    def __init__(self, wire: list[bytes]) -> None:
        self.write = wire.append


class _ClientConn:
    """The server's side of the client's connection, as a request writes to it."""

    closed = write_paused = False
    on_resume = None
    write_chunk = HTTPProtocol.write_chunk  # (the server's own framing)
    write_framed = HTTPProtocol.write_framed

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
    error = None

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


def _spliced_by_connection(relay, groups: list[list[bytes]]) -> bytes:
    """The same through a real upstream connection: each group one read of its chunks,
    framed as an engine frames them (a read of one chunk framed by the connection itself,
    ``tests/upstream/test_chunk_reads.py``), then the body's end."""
    loop = asyncio.new_event_loop()
    try:
        client = _ClientConn(loop)
        req = _Request(client, {"method": "POST", "http_version": "1.1"}, True)
        req.start(200, [(b"content-type", b"text/event-stream")])
        up = http1.Connection(http1.Pool(loop), http1.Origin("http", "127.0.0.1", 80))
        up.connection_made(_UpstreamTransport())
        up.send(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        up.data_received(HEAD + _framed(groups[0][0]))
        sp = Splice(relay, req, up, 60.0)
        sp.raw.appendleft(up.take())  # x.first, as run() takes it
        up.attach(sp)
        for group in groups[1:]:
            up.data_received(b"".join(_framed(chunk) for chunk in group))
        up.data_received(b"0\r\n\r\n")
        assert up.complete and sp.ended
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
