"""A Responses request checked with what its session's previous request lends (the input
items of the same bytes, the very structs checked then, and the walk's counts after
them) is accepted, refused and typed exactly as when it is checked alone."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixgate.apis.messages.request import SessionTurns
from prefixgate.config import Limits
from prefixgate.errors import InvalidRequest
from prefixgate.protocol import responses as rp
from prefixgate.protocol.responses import decode_responses_body

TIGHT = Limits(max_blocks=6, max_tools=3)


def _text(kind: str, text: str) -> dict:
    return {"type": kind, "text": text}


_ITEMS = [
    {"type": "message", "role": "user", "content": "plain"},
    {
        "type": "message",
        "role": "user",
        "content": [_text("input_text", "a"), _text("input_text", "b")],
    },
    {"type": "message", "role": "assistant", "content": [_text("output_text", "ok")]},
    {"type": "message", "role": "developer", "content": [_text("input_text", "dev")]},
    {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_image", "image_url": "data:x"}],
    },
    {"type": "message", "role": "user", "content": [{"type": "input_image", "file_id": "f"}]},
    {"type": "message", "role": "robot", "content": "who"},
    {"type": "message", "role": "assistant", "content": [_text("input_file", "no")]},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"type": "function_call", "call_id": "c2", "name": "g", "arguments": '{"a":1}'},
    {"type": "function_call_output", "call_id": "c1", "output": "done"},
    {"type": "function_call_output", "call_id": "c2", "output": [_text("input_text", "r")]},
    {"type": "custom_tool_call", "call_id": "c3", "name": "h", "input": "x"},
    {"type": "custom_tool_call_output", "call_id": "c3", "output": "y"},
    {"type": "function_call_output", "call_id": "c3", "output": "kind"},
    {"type": "reasoning", "summary": [_text("summary_text", "s")]},
    {"type": "reasoning", "summary": [_text("output_text", "bad")]},
    {"type": "item_reference", "id": "r"},
    {"type": "compaction_trigger"},
    {"type": 7},  # not of the item's shape: refused by the decode
    "an item that is no object",
]
_TOOLS = [
    {"type": "function", "name": "f", "parameters": {"type": "object"}},
    {"type": "function", "name": "g", "parameters": {"type": "object"}},
    {"type": "custom", "name": "h"},
    {"type": "function", "name": "bad", "parameters": [1]},
    {"type": "function", "name": 5},
]

_item = st.sampled_from(_ITEMS)
_tools = st.lists(st.sampled_from(_TOOLS), max_size=4)


@st.composite
def _session(draw) -> list[dict]:
    """Three requests of a session: each the one before with items added, and maybe an
    item replaced or left out, or other tools."""
    body = {"model": "m", "input": draw(st.lists(_item, min_size=1, max_size=6))}
    tools = draw(_tools)
    if tools:
        body["tools"] = tools
    out = [body]
    for _ in range(2):
        body = {**body, "input": body["input"] + draw(st.lists(_item, max_size=3))}
        edit = draw(st.sampled_from(["none", "none", "replace", "remove", "tools"]))
        items = list(body["input"])
        if edit == "replace" and items:
            items[draw(st.integers(0, len(items) - 1))] = draw(_item)
        elif edit == "remove" and len(items) > 1:
            del items[draw(st.integers(0, len(items) - 1))]
        elif edit == "tools":
            body["tools"] = draw(_tools)
        body["input"] = items
        out.append(body)
    return out


def _verdict(raw: bytes, limits: Limits, lend=None):
    try:
        body = decode_responses_body(raw, limits, lend, None if lend is None else lambda _: "s")
    except InvalidRequest as exc:
        return ("refused", str(exc), exc.param), None
    return ("ok", body.images), body


def _refusals(body: dict, turns: SessionTurns) -> tuple[str, str]:
    """Why ``body`` is refused with what the session lends, and alone (each must be)."""
    raw = json.dumps(body).encode()
    with pytest.raises(InvalidRequest) as lent:
        decode_responses_body(raw, Limits(), turns, lambda _: "s")
    with pytest.raises(InvalidRequest) as alone:
        decode_responses_body(raw, Limits())
    return str(lent.value), str(alone.value)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_session(), st.sampled_from([Limits(), TIGHT]))
def test_a_lent_check_is_the_check_alone(bodies, limits):
    turns = SessionTurns(1 << 24)
    for b in bodies:
        raw = json.dumps(b).encode()
        lent, got = _verdict(raw, limits, turns)
        alone, want = _verdict(raw, limits)
        assert lent == alone
        if got is not None:
            assert want is not None and got.typed == want.typed


def test_a_turn_checks_its_new_items_alone_and_takes_the_checked_ones(monkeypatch):
    """What the previous turn checked is taken as its very structs, not walked again; a
    new item is checked where it stands (its call found among the lent ones)."""
    first = {"model": "m", "tools": _TOOLS[:2], "input": [_ITEMS[1], _ITEMS[8], _ITEMS[4]]}
    second = {**first, "input": [*first["input"], _ITEMS[10], _ITEMS[2]]}
    turns = SessionTurns(1 << 24)
    one = decode_responses_body(json.dumps(first).encode(), Limits(), turns, lambda _: "s")
    walked: list[str] = []
    real = rp._check_item
    monkeypatch.setattr(
        rp, "_check_item", lambda it, where, st: (walked.append(where), real(it, where, st))
    )
    tools: list[object] = []
    real_tools = rp._check_tools
    monkeypatch.setattr(rp, "_check_tools", lambda t, lim: (tools.append(t), real_tools(t, lim)))
    two = decode_responses_body(json.dumps(second).encode(), Limits(), turns, lambda _: "s")
    assert walked == ["input[3]", "input[4]"] and tools == []
    assert two.typed.tools is one.typed.tools  # the very list
    assert two.typed.input[:3] == one.typed.input and two.typed.input[0] is one.typed.input[0]
    assert two.images  # the lent image counts
    # an output whose call is not among the lent ones is refused as alone
    third = {**second, "input": [*second["input"], {**_ITEMS[10], "call_id": "c9"}]}
    lent, alone = _refusals(third, turns)
    assert lent == alone and "input[5].call_id" in lent


def test_a_call_left_out_of_the_lent_items_is_not_found_by_a_later_output():
    """The calls the walk knows after the lent items are theirs alone: an item of the
    previous turn's past the first that changed, a call, is not."""
    first = {"model": "m", "input": [_ITEMS[0], _ITEMS[8], _ITEMS[10]]}
    second = {"model": "m", "input": [_ITEMS[0], _ITEMS[2], _ITEMS[10]]}  # the call replaced
    turns = SessionTurns(1 << 24)
    decode_responses_body(json.dumps(first).encode(), Limits(), turns, lambda _: "s")
    lent, alone = _refusals(second, turns)
    assert lent == alone and "input[2].call_id" in lent


def test_what_a_session_keeps_holds_no_request_body_alive():
    import gc
    import sys

    turns = SessionTurns(1 << 24)
    raws = [
        json.dumps({"model": "m", "input": [_ITEMS[1], _ITEMS[8], _ITEMS[10]][:n]}).encode()
        for n in (1, 2, 3)
    ]
    alone = sys.getrefcount(raws[0])
    for i in range(3):
        decode_responses_body(raws[i], Limits(), turns, lambda _: "s")
    gc.collect()
    got = [sys.getrefcount(raws[i]) for i in range(3)]  # (not in an assert: pytest's rewriting)
    assert got == [alone] * 3
    assert 0 < turns.bytes <= turns.budget
