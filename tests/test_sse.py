"""The gateway's SSE decoder and ``first_event`` (the first-event check before any byte goes
to the client reads only the first event of a chunk that may hold a whole answer)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixgate.sse import SSEDecoder, first_event

_line = st.sampled_from(
    [b"data: {}", b'data: {"a":1}', b"data: [DONE]", b"event: x", b": ping", b"id: 3", b"data:"]
)
_block = st.lists(_line, min_size=1, max_size=3).map(b"\n".join)
_newline = st.sampled_from([b"\n", b"\r\n", b"\r"])


@given(st.lists(st.tuples(_block, _newline), max_size=6), st.binary(max_size=8))
def test_first_event_is_the_decoders_first(blocks, tail):
    chunk = b"".join(block.replace(b"\n", nl) + nl + nl for block, nl in blocks) + tail
    events = SSEDecoder().feed(chunk)
    assert first_event(chunk) == (events[0] if events else None)


def test_first_event_skips_comment_blocks_and_waits_for_a_complete_one():
    assert first_event(b": ping\n\ndata: 1\n\ndata: 2\n\n") == (None, b"1")
    assert first_event(b"event: a\r\ndata: x\r\n\r\n") == (b"a", b"x")
    assert first_event(b"data: incomplete\n") is None
    assert first_event(b"<html>garbage</html>") is None


@pytest.mark.parametrize(
    "chunks, events",
    [
        ([b"data: {}\n\n"], [(None, b"{}")]),  # one whole event in a read: the short way
        ([b"data: a\ndata: b\n\n"], [(None, b"a\nb")]),
        ([b"data:x\n\n"], [(None, b"x")]),
        ([b"event: e\ndata: x\n\n"], [(b"e", b"x")]),
        ([b"data: x\r\n\r\n"], [(None, b"x")]),
        ([b"data: a\n\ndata: b\n\n"], [(None, b"a"), (None, b"b")]),
        ([b"data: a", b"\n\n", b"data: b\n\n"], [(None, b"a"), (None, b"b")]),
        ([b"data: a\n", b"\ndata: b\n\n"], [(None, b"a"), (None, b"b")]),
        # a lone CR ends a line: one read, two events, though its only LF is at its end
        ([b"data: a\r\rdata: b\n\n"], [(None, b"a"), (None, b"b")]),
        ([b"data: a\rdata: b\n\n"], [(None, b"a\nb")]),
    ],
)
def test_one_event_per_read_and_the_general_case_agree(chunks, events):
    dec = SSEDecoder()
    got = [ev for c in chunks for ev in dec.feed(c)]
    assert got == events and dec.pending == 0
