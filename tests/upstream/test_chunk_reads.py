"""A spliced stream's reads that are one whole chunk each skip the parser
(``upstream/http1.py``'s ``Connection.data_received``): the connection frames such a read
itself when its parser sits between two chunks. What it must never do is take a read the
parser would not, or take it otherwise. So here a chunked body, its chunks' size lines
written every way HTTP allows (upper and lower case, leading zeros, extensions) and some
corrupted, is cut into reads (mostly at the chunks' ends, as an engine writes them, else
anywhere) and fed to a connection with a sink; what the sink gets, whether the body ends
and whether it fails are what httptools' parser alone makes of the same bytes."""

from __future__ import annotations

import asyncio

import httptools
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixgate.upstream import http1

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class _Transport:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False
        self.protocol = None

    def set_protocol(self, protocol) -> None:
        self.protocol = protocol

    def get_extra_info(self, name, default=None):
        return default

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def writelines(self, parts) -> None:
        self.sent.extend(parts)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


class _Sink:
    """A splice's side of the connection: the body bytes of each read, as it takes them."""

    def __init__(self, conn: http1.Connection) -> None:
        self.conn, self.reads = conn, []
        self.ended = False

    def flush(self) -> None:
        chunks = self.conn.chunks
        if chunks:
            self.reads.append(b"".join(chunks))
            chunks.clear()

    def feed(self, data: bytes, framed: bytes | None = None) -> None:
        # (the read as it came: one chunk framed as the gateway's server frames one)
        assert framed == b"%x\r\n" % len(data) + data + b"\r\n"
        self.reads.append(data)

    def news(self) -> None:
        self.flush()
        self.ended = True


class _Counting:
    """The connection's parser, its reads counted."""

    def __init__(self, parser) -> None:
        self.parser, self.fed = parser, 0

    def feed_data(self, data: bytes) -> None:
        self.fed += 1
        self.parser.feed_data(data)

    def __getattr__(self, name):
        return getattr(self.parser, name)


class _Reference:
    """httptools' parser alone: the body bytes, the end, the error."""

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.complete = self.failed = False
        self.parser = httptools.HttpResponseParser(self)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def feed(self, reads: list[bytes]) -> None:
        for read in reads:
            try:
                self.parser.feed_data(read)
            except httptools.HttpParserError:
                self.failed = True
                return


def _spliced(reads: list[bytes], attach_after: int = 1) -> tuple[_Sink, http1.Connection, int]:
    """The reads through a connection whose sink is attached after ``attach_after`` of
    them (a splice begins once the head is read); (sink, connection, the parser's reads)."""
    loop = asyncio.new_event_loop()
    try:
        conn = http1.Connection(http1.Pool(loop), http1.Origin("http", "127.0.0.1", 80))
        conn.connection_made(_Transport())
        conn.send(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        counting = conn.parser = _Counting(conn.parser)
        sink, attached = _Sink(conn), False
        for i, read in enumerate(reads):
            if i == attach_after:
                conn.attach(sink)
                attached = True
            if conn.closed:
                break
            conn.data_received(read)
        if not attached:
            conn.attach(sink)
        return sink, conn, counting.fed
    finally:
        loop.close()


def _size_line(n: int, form: str) -> bytes:
    return {
        "lower": b"%x" % n,
        "upper": b"%X" % n,
        "zeros": b"00%x" % n,
        "ext": b"%x;name=value" % n,
    }[form] + b"\r\n"


# The ways a size line or a chunk's end can be wrong (each one the parser refuses).
_CORRUPT = {
    "prefix": lambda c: b"0x" + c,
    "plus": lambda c: b"+" + c,
    "space": lambda c: b" " + c,
    "underscore": lambda c: c[:1] + b"_" + c[1:],
    "not hex": lambda c: b"g" + c[1:],
    "no crlf": lambda c: c[:-2] + b"XY",
    "short": lambda c: c[:-3] + c[-2:],
    "long": lambda c: c[:-2] + b"z\r\n",
}


@st.composite
def chunked_bodies(draw) -> tuple[list[bytes], list[bytes]]:
    """(the chunks as framed, their data): pieces of SSE text with quotes, line breaks
    and CRLFs inside, sized 1 to 3,780 bytes."""
    datas = draw(
        st.lists(
            st.one_of(
                st.binary(min_size=1, max_size=40),
                st.builds(
                    lambda t, n: (b'data: {"c":"%s"}\n\n' % t) * n,
                    st.sampled_from([b"a", b"\\r\\n", b"\r\n", b"\xe4\xb8\xad", b'\\"']),
                    st.integers(1, 180),  # (up to 3,780 bytes: chunks under 4 KiB)
                ),
            ),
            min_size=1,
            max_size=12,
        )
    )
    forms = draw(
        st.lists(
            st.sampled_from(["lower", "lower", "lower", "upper", "zeros", "ext"]),
            min_size=len(datas),
            max_size=len(datas),
        )
    )
    framed = [_size_line(len(d), f) + d + b"\r\n" for d, f in zip(datas, forms, strict=True)]
    return framed, datas


def _reads(draw, parts: list[bytes]) -> list[bytes]:
    """The parts cut into reads: each part one read, or a few together, or cut anywhere."""
    how = draw(st.sampled_from(["each", "each", "grouped", "anywhere"]))
    if how == "each":
        return list(parts)
    if how == "grouped":
        reads, i = [], 0
        while i < len(parts):
            n = draw(st.integers(1, 3))
            reads.append(b"".join(parts[i : i + n]))
            i += n
        return reads
    whole = b"".join(parts)
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(whole) - 1)), max_size=8))))
    return [whole[a:b] for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True) if a < b]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=chunked_bodies(), data=st.data())
def test_a_read_is_taken_as_the_parser_takes_it(body, data) -> None:
    framed, _ = body
    if data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(framed) - 1))
        how = data.draw(st.sampled_from(sorted(_CORRUPT)))
        framed = [*framed[:i], _CORRUPT[how](framed[i]), *framed[i + 1 :]]
    end = data.draw(st.sampled_from([b"0\r\n\r\n", b"0\r\nx-trailer: t\r\n\r\n", b""]))
    parts = [HEAD, *framed, *([end] if end else [])]
    reads = _reads(data.draw, parts)
    attach_after = data.draw(st.integers(1, max(1, len(reads))))

    ref = _Reference()
    ref.feed(reads)
    sink, conn, _ = _spliced(reads, attach_after)
    assert b"".join(sink.reads) == b"".join(ref.body)
    assert (conn.error is not None) == ref.failed
    assert conn.complete == (ref.complete and not ref.failed)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=chunked_bodies())
def test_an_engines_stream_read_a_chunk_at_a_time_is_framed_past_the_parser(body) -> None:
    """vLLM and SGLang write each event as one chunk, its size in lower-case hex: once
    the head is read, every read that is one such chunk is taken whole, as it came, and
    the parser reads only the head and the end."""
    framed, datas = body
    framed = [b"%x\r\n" % len(d) + d + b"\r\n" for d in datas]
    reads = [HEAD, *framed, b"0\r\n\r\n"]
    sink, conn, fed = _spliced(reads)
    assert sink.reads == datas
    assert conn.complete and conn.error is None and sink.ended
    assert fed == 2  # the head, and the last chunk


@pytest.mark.parametrize(
    ("head", "reads"),
    [
        (HEAD.replace(b"transfer-encoding: chunked", b"content-length: 18"), 2),
        (HEAD.replace(b"chunked", b"gzip, chunked"), 2),
        (HEAD.replace(b"transfer-encoding: chunked", b"connection: close"), 2),
    ],
)
def test_a_body_not_chunked_as_expected_is_left_to_the_parser(head, reads) -> None:
    """A body framed by its length, or by the connection's end (or chunked after another
    coding), is never read as chunks by the connection: the parser reads it all."""
    read = b"4\r\nabcd\r\n"
    ref = _Reference()
    ref.feed([head] + [read] * reads)
    sink, conn, fed = _spliced([head] + [read] * reads)
    assert b"".join(sink.reads) == b"".join(ref.body) != b""
    assert fed == 1 + reads


def _framed(data: bytes, size: bytes | None = None) -> bytes:
    return (b"%x" % len(data) if size is None else size) + b"\r\n" + data + b"\r\n"


@pytest.mark.parametrize(
    "reads",
    [
        # A chunk's data that is itself a chunk, read apart from its size line: the
        # parser is inside a chunk then, not between two.
        [HEAD, b"1a\r\n", _framed(b"x" * 20), b"\r\n0\r\n\r\n"],
        # A read that ends inside a size line's extension, and the rest of the line with
        # what follows looks like one whole chunk (of 0xab bytes).
        [
            HEAD,
            b"1a;x=",
            b"ab\r\n" + b"d" * 26 + b"\r\n" + _framed(b"e" * 0x8B),
            b"0\r\n\r\n",
        ],
    ],
    ids=["inside-a-chunk", "inside-a-size-line"],
)
def test_a_read_that_looks_like_a_chunk_where_the_parser_is_not_between_two_is_parsed(
    reads,
) -> None:
    # (the third read, alone, is one whole chunk: its size's bytes and CRLF)
    size, _, rest = reads[2].partition(b"\r\n")
    assert len(rest) == int(size, 16) + 2 and rest.endswith(b"\r\n")
    ref = _Reference()
    ref.feed(reads)
    assert not ref.failed and ref.complete
    sink, conn, fed = _spliced(reads)
    assert b"".join(sink.reads) == b"".join(ref.body)
    assert fed == len(reads)


def test_chunks_at_the_edges_of_their_size_lines_lengths() -> None:
    """Sizes where the size line gains a digit, and past the sizes framed here (4 KiB and
    more: the parser's): each chunk's data as it came, the parser reading only those."""
    datas = [b"x" * n for n in (1, 15, 16, 17, 255, 256, 257, 4095, 4096, 5000)]
    reads = [HEAD, *(_framed(d) for d in datas), b"0\r\n\r\n"]
    sink, conn, fed = _spliced(reads)
    assert sink.reads == datas
    assert conn.complete and conn.error is None
    assert fed == 2 + 2  # the head, the end, and the two chunks of 4 KiB and more


def test_a_reads_length_names_the_one_chunk_it_can_be() -> None:
    """``READ_LINES``: for each read length, the size line of the one chunk of 1 to 4,095
    bytes that, framed by the server's ``SIZE_LINES`` with its CRLF, is that long."""
    from prefixgate.chunked import READ_LINES, SIZE_LINES

    framings: dict[int, list[bytes]] = {}
    for m in range(1, 4096):
        framings.setdefault(len(SIZE_LINES[m]) + m + 2, []).append(SIZE_LINES[m])
    assert all(len(lines) == 1 for lines in framings.values())
    assert len(READ_LINES) == max(framings) + 1
    for n, line in enumerate(READ_LINES):
        assert line == (framings[n][0] if n in framings else None), n
    assert READ_LINES[6] == b"1\r\n" and READ_LINES[21] is None and READ_LINES[4102] == b"fff\r\n"
