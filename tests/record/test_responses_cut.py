"""A Codex session's turns cost what is new in them: a Responses request's segments cut
from its bytes going on from the session's previous request (``cut_responses``), and its
conversion to Chat lent by the previous turn's (``convert_lent``), each
exactly what the request alone gives, through the edits a client may make; and the
session's capture the same as one that walks every request whole."""

from __future__ import annotations

import copy
import json
import sys

import msgspec

from prefixgate import hygiene
from prefixgate.apis.messages.request import ConvertOptions, SessionTurns
from prefixgate.apis.responses.request import convert, convert_lent
from prefixgate.apis.responses.segments import (
    cut_responses,
    segments_responses,
    segments_responses_from_bytes,
)
from prefixgate.config import ChannelConfig, Limits
from prefixgate.engine.order import RenderOrders
from prefixgate.lab.traffic.claude_code import ClaudeCodeSession
from prefixgate.lab.traffic.codex import as_codex
from prefixgate.lab.traffic.spec import AGENT_CLAUDE_CODE, TrafficSpec
from prefixgate.protocol.responses import decode_responses_body
from prefixgate.record.capture import Capturer
from prefixgate.record.cut import pieces_of
from prefixgate.record.record import Record
from tests.conftest import captured_alike


def _codex_turns(seed: int = 7, turns: int = 14) -> list[tuple[dict, dict]]:
    spec = TrafficSpec(
        sessions=1, turns=turns, titles=False, tools_kb=8, system_kb=2,
        tool_result_chars=(200, 3000), compact_chars=0, mix={AGENT_CLAUDE_CODE: 1.0},
        models=("m",),
    )  # fmt: skip
    out = []
    for r in ClaudeCodeSession(spec, seed).requests():
        if r.kind == "turn":
            body, headers = as_codex(r.content(), r.headers)
            out.append((json.loads(body), headers))
    return out


def _edited(turns: list[tuple[dict, dict]]) -> list[tuple[dict, dict]]:
    """The turns with edits on the way, each for two turns: tools reordered, the
    instructions changed, a developer item that leads, an item left out, an item's id
    changed in the middle, a tool's output edited there, a developer item later on, the
    input a string, the instructions gone."""
    edits = [
        lambda b: b.update(tools=b["tools"][::-1]),
        lambda b: b.update(instructions=b["instructions"] + " (edited)"),
        lambda b: b["input"].insert(0, {"type": "message", "role": "developer",
                                        "content": [{"type": "input_text", "text": "lead"}]}),
        lambda b: b["input"].remove(next(i for i in b["input"] if i["type"] == "reasoning")),
        lambda b: b["input"][len(b["input"]) // 2].update(id="rs_1"),
        lambda b: next(i for i in b["input"][len(b["input"]) // 2 :]
                       if i["type"] == "function_call_output").update(output="edited"),
        lambda b: b["input"].insert(5, {"type": "message", "role": "developer",
                                        "content": [{"type": "input_text", "text": "later"}]}),
        lambda b: b.update(input="just a string"),
        lambda b: b.pop("instructions"),
    ]  # fmt: skip
    out = []
    for k, (body, headers) in enumerate(turns):
        body = copy.deepcopy(body)
        for j, edit in enumerate(edits):
            if j + 2 <= k < j + 4:  # each for two turns, then as it was
                edit(body)
        out.append((body, headers))
    return out


def test_a_responses_cut_going_on_from_its_previous_one_is_the_cut_of_it_alone():
    previous = None
    lent = 0
    for body, _ in _edited(_codex_turns()) + _codex_turns(3, 8):
        raw = msgspec.json.encode(body)
        got = cut_responses(raw, previous)
        alone = cut_responses(raw, None)
        assert got is not None and alone is not None
        segs, pieces = got
        assert segs == alone[0] == segments_responses_from_bytes(raw)
        assert segs == segments_responses(json.loads(raw))
        if pieces is not None:
            assert list(pieces) == list(alone[1]) == pieces_of(raw, segs)
            if previous is not None and pieces.same:
                assert all(a is b for a, b in zip(pieces[: pieces.same], previous, strict=False))
                lent += 1
        previous = pieces
    assert lent > 8  # most turns went on from the one before


def test_a_responses_cut_takes_what_the_turn_resends_from_the_previous_one():
    """The pieces of the items a turn re-sends are the previous turn's very pieces (their
    bytes not kept twice); only the new items are made."""
    turns = _codex_turns()
    first = cut_responses(msgspec.json.encode(turns[-2][0]))
    then = cut_responses(msgspec.json.encode(turns[-1][0]), first[1])
    assert first is not None and then is not None
    before, after = first[1], then[1]
    n = len(before)  # the tools, the instructions and every item of the turn before
    assert after.same == n and after.base is before
    assert all(a is b for a, b in zip(after[:n], before, strict=True))
    assert len(after) > n


def test_a_codex_sessions_capture_goes_on_from_its_previous_turn_as_a_whole_walk_gives():
    """Through the gateway's capture (a Responses request converted to Chat): the records,
    the change memory's kept requests and its bytes equal those of a capture that walks
    every request whole, edits on the way."""
    ch = ChannelConfig(name="c", base_url="http://127.0.0.1:9/v1")
    orders, opts = RenderOrders(), ConvertOptions(upstream_model="m")
    lending, walking = Capturer(), Capturer()
    walking.changes.go_on = False
    edited, clean = _edited(_codex_turns()), _codex_turns(3, 8)
    went_on = {id(edited): 0, id(clean): 0}
    for turns, k, (body, headers) in [(t, k, x) for t in (edited, clean) for k, x in enumerate(t)]:
        raw = msgspec.json.encode(body)
        recs = []
        for cap in (lending, walking):
            decoded = decode_responses_body(raw, Limits())
            out = convert(decoded.typed, opts)
            moved = hygiene.apply_chat(out["messages"], ch, orders)
            if moved is not None:
                out = {**out, "messages": moved}
            rec = Record(
                request_id=f"r{k}-{id(turns)}",
                received_at=0.0,
                endpoint="responses",
                session_id=headers["session-id"],
            )
            cap(rec, decoded, out, ch, None, raw, msgspec.json.encode(out), orders=orders)
            recs.append(rec)
        a, b = recs
        captured_alike(lending, walking, a, b)
        assert a.segments_in and a.segments_out
        x = lending.changes._sessions[next(reversed(lending.changes._sessions))]
        if len(x) > 1 and x[-1].into[0] is x[-2].into[0]:
            went_on[id(turns)] += 1
    assert went_on[id(clean)] == len(clean) - 1  # every turn after the first
    assert went_on[id(edited)] >= 4  # and the edited session's between its edits


def test_a_codex_turns_conversion_is_lent_by_its_previous_one_and_is_the_conversion_alone():
    """What a turn re-sends converts to the very messages (and tools) the previous turn's
    did, up to the last point where no assistant turn was being gathered; the rest is
    converted afresh: the Chat request and its body are those of the request alone,
    through edits (tools reordered, instructions changed, a leading developer item, an
    item left out or edited, a later developer item, a string input)."""
    opts = ConvertOptions(upstream_model="m")
    edited, clean = _edited(_codex_turns()), _codex_turns(3, 10)
    for turns in (edited, clean):
        memory, lent = SessionTurns(1 << 30), 0
        for body, headers in turns:
            raw = msgspec.json.encode(body)
            key = ("responses", "c", headers["session-id"])
            before = memory._d.get(key)
            typed = decode_responses_body(raw, Limits()).typed
            out = convert_lent(memory, key, typed, opts, len(raw))
            alone = convert(decode_responses_body(raw, Limits()).typed, opts)
            data = memory.encode(key, out)
            assert data == msgspec.json.encode(out) == msgspec.json.encode(alone)
            if before is not None and any(m is k for m in out["messages"] for k in before.flat):
                lent += 1
            if before is not None and out.get("tools") is before.chat_tools:
                assert typed.tools == before.tools  # only equal tools lend
        # every turn after the first, and the edited session's between its edits
        assert lent == len(turns) - 1 if turns is clean else lent >= 4


def test_a_codex_sessions_conversion_memory_keeps_no_earlier_body_alive():
    """What the memory keeps of a turn holds its texts' own copies: the messages a later
    turn takes as they were do not keep alive the body that first sent them (every body
    of the session would stay), only the latest body is held (its typed items are views
    of it, to compare the next turn with)."""
    opts = ConvertOptions(upstream_model="m")
    memory, turns = SessionTurns(1 << 30), _codex_turns(3, 5)
    raws = [msgspec.json.encode(body) for body, _ in turns]
    key = ("responses", "c", turns[0][1]["session-id"])
    counts = [sys.getrefcount(r) for r in raws]
    for raw in raws:
        convert_lent(memory, key, decode_responses_body(raw, Limits()).typed, opts, len(raw))
    del raw
    after = [sys.getrefcount(r) for r in raws]
    assert after[:-1] == counts[:-1]
    assert after[-1] > counts[-1]  # the check sees a view


def test_tools_equal_but_for_the_type_of_strict_are_converted_again():
    """``strict: 1`` equals ``strict: true`` as values, but only ``true`` is sent on: a turn
    whose tools differ so from the previous turn's does not take their conversion."""
    opts = ConvertOptions(upstream_model="m")
    memory = SessionTurns(1 << 30)
    (body, headers), *_ = _codex_turns(3, 2)
    key = ("responses", "c", headers["session-id"])
    for strict in (1, True, 1):
        body = {**body, "tools": [{**t, "strict": strict} for t in body["tools"]]}
        raw = msgspec.json.encode(body)
        out = convert_lent(memory, key, decode_responses_body(raw, Limits()).typed, opts, len(raw))
        alone = convert(decode_responses_body(raw, Limits()).typed, opts)
        assert msgspec.json.encode(out) == msgspec.json.encode(alone)
        assert all(("strict" in t["function"]) == (strict is True) for t in out["tools"])


def test_a_turn_that_goes_on_with_an_assistant_turn_being_gathered_converts_it_whole():
    """A turn whose previous one ended in the middle of an assistant turn (reasoning and
    a call, its output still to come): the messages before that turn are lent, the
    assistant message is made again with what the new items add to it."""
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}
    said = {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": "on it"}]}  # fmt: skip
    think = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]}
    call = {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c1"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "done"}
    first = [user, said, user, think, call]  # the second assistant turn still gathering
    then = [*first, output, user]
    opts, memory, key = ConvertOptions(upstream_model="m"), SessionTurns(1 << 30), ("r", "c", "s")
    outs = []
    for items in (first, then):
        raw = msgspec.json.encode({"model": "m", "instructions": "be brief", "input": items})
        out = convert_lent(memory, key, decode_responses_body(raw, Limits()).typed, opts, 1)
        alone = convert(decode_responses_body(raw, Limits()).typed, opts)
        assert msgspec.json.encode(out) == msgspec.json.encode(alone)
        outs.append(out["messages"])
    a, b = outs
    assert [m["role"] for m in b] == ["system", "user", "assistant", "user", "assistant", "tool",
                                      "user"]  # fmt: skip
    assert all(x is y for x, y in zip(a[:4], b[:4], strict=True))  # up to the pending turn
    assert b[4] is not a[4] and b[4] == a[4]  # made again: its call's output came after it
