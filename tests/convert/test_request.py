"""The Messages → Chat conversion lent a session's previous turn (``SessionTurns``): the
same output as converting alone, what is lent is what was equal, and the memory is
bounded."""

from __future__ import annotations

import gc
import json
import sys

from prefixgate.apis.messages.request import (
    ConvertOptions,
    SessionTurns,
    anthropic_to_openai,
    convert,
    plain,
)
from prefixgate.config import Limits
from prefixgate.protocol.messages_body import decode_messages_body


def _typed(body: dict):
    raw = json.dumps(body).encode()
    return decode_messages_body(raw, Limits()).typed, len(raw)


def _turn(n: int, tag: str = "") -> dict:
    messages = []
    for i in range(n):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"q{i}{tag}"}]})
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"a{i}"},
                    {"type": "tool_use", "id": f"t{i}", "name": "Read", "input": {"i": i}},
                ],
            }
        )
    messages.append(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t0", "content": "r"}]}
    )
    return {"model": "m", "max_tokens": 10, "messages": messages}


def test_a_turn_converts_as_alone_and_borrows_only_what_is_equal():
    turns = SessionTurns(1 << 20)
    opts = ConvertOptions("u")
    first = turns.convert(("ch", "s"), *_typed(_turn(3))[:1], opts, 100)
    typed, size = _typed(_turn(4))
    second = turns.convert(("ch", "s"), typed, opts, size)
    assert plain(second) == plain(convert(typed, opts))
    lent = [m for m in second["messages"] if any(m is f for f in first["messages"])]
    assert len(lent) == 6  # the three exchanges re-sent; the new ones and the edit not
    edited, size = _typed(_turn(4, tag=" (edited)"))
    third = turns.convert(("ch", "s"), edited, opts, size)
    assert plain(third) == plain(convert(edited, opts))
    assert not any(
        m is s for m in third["messages"] if m["role"] == "user" for s in second["messages"]
    )
    other = ConvertOptions("u", history_thinking="drop")
    assert plain(turns.convert(("ch", "s"), edited, other, size)) == plain(convert(edited, other))


def test_the_memory_keeps_within_its_budget():
    typed, size = _typed(_turn(2))
    turns = SessionTurns(2 * (3 * size + SessionTurns.ENTRY))
    for s in range(5):
        turns.convert(("ch", str(s)), typed, ConvertOptions("u"), size)
        assert turns.bytes <= turns.budget
    assert len(turns) == 2
    none = SessionTurns(0)
    none.convert(("ch", "s"), typed, ConvertOptions("u"), size)
    assert len(none) == 0 and none.bytes == 0


def test_what_is_kept_holds_no_earlier_body_alive():
    # A message's conversion is lent turn after turn: were its texts views of the body
    # that first sent it, every earlier body of the session would stay in memory.
    turns, opts = SessionTurns(1 << 20), ConvertOptions("u")
    raws = [json.dumps(_turn(n)).encode() for n in (3, 4, 5, 6)]
    alone = sys.getrefcount(raws[0])
    for raw in raws:
        turns.convert(("ch", "s"), decode_messages_body(raw, Limits()).typed, opts, len(raw))
    gc.collect()
    first, latest = sys.getrefcount(raws[0]), sys.getrefcount(raws[-1])  # (not in an assert:
    assert first == alone  # pytest's rewriting would hold one more reference)
    assert latest > alone  # the latest one is kept, its size counted


def test_a_document_text_that_is_not_a_string_converts_to_no_text():
    """A document's text given as null or a number (a client's bug) is no text, never a
    crash of the conversion (found by the lent-decode pairs of test_messages_body.py)."""
    for source in (
        {
            "type": "content",
            "content": [{"type": "text", "text": None}, {"type": "text", "text": "b"}],
        },
        {"type": "text", "data": 7},
    ):
        block = {"type": "document", "source": source}
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [block]}]}
        out = anthropic_to_openai(body, ConvertOptions("u"))
        assert out["messages"] == [
            {"role": "user", "content": "b" if source["type"] == "content" else ""}
        ]


def test_a_body_encoded_from_the_previous_one_is_the_body_encoded_alone():
    """``encode_lent``: whatever the previous body lends (all of its messages, some, none;
    the tools list or not; another model; nothing after the messages), the bytes are
    those of the request encoded alone."""
    from msgspec import json as mjson

    from prefixgate.apis.messages.request import encode_lent

    a, b, c = ({"role": "user", "content": f"m{i}"} for i in range(3))
    tools = [{"type": "function", "function": {"name": "f"}}]
    first = {"model": "m", "messages": [a, b], "tools": tools, "max_tokens": 5}
    prev = encode_lent(first, None)
    assert prev.data == mjson.encode(first) and prev.ends[-1] == prev.data.index(b"]") + 0
    cases = [
        {"model": "m", "messages": [a, b, c], "tools": tools, "max_tokens": 5},  # one more
        {"model": "m", "messages": [a, b], "tools": tools, "max_tokens": 5},  # the same
        {"model": "m", "messages": [a], "max_tokens": 5},  # fewer, no tools
        {"model": "m", "messages": [dict(a), b], "tools": list(tools)},  # equal, not the same
        {"model": "n", "messages": [a, b, c], "tools": tools},  # another model
        {"model": "m", "messages": [a, b]},  # nothing after the messages
        {"model": "m", "messages": []},
        {"messages": [a], "model": "m"},  # keys in another order
    ]
    for out in cases:
        got = encode_lent(out, prev)
        assert got.data == mjson.encode(out), out
        again = encode_lent({**out, "messages": [*out["messages"], c]}, got)
        assert again.data == mjson.encode({**out, "messages": [*out["messages"], c]})
