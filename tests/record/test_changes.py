"""Prefix changes found at capture time: each request of a session against the previous
one, as the gateway converts and captures it (the capture step alone; the whole gateway
is driven in tests/doctor/test_breakers.py)."""

from __future__ import annotations

import msgspec
import pytest

from prefixgate.apis.messages.request import ConvertOptions, convert
from prefixgate.apis.responses.request import convert as convert_responses
from prefixgate.config import parse_config
from prefixgate.engine.order import RenderOrders
from prefixgate.identify import session_of_messages, session_of_responses
from prefixgate.lab.traffic import breakers as bk
from prefixgate.protocol.messages_body import decode_messages_body
from prefixgate.protocol.openai import decode_chat_body
from prefixgate.protocol.responses import decode_responses_body
from prefixgate.record.capture import Capturer
from prefixgate.record.changes import ChangeTracker
from prefixgate.record.compacted import summary_request
from prefixgate.record.record import Record


def channel(order="tools_first", kind="openai"):
    return parse_config(
        {
            "channels": [
                {"name": "c", "kind": kind, "base_url": "http://u/v1", "render_order": order}
            ]
        }
    ).channels[0]


def capture(cap: Capturer, ch, raw: bytes, headers: dict) -> Record:
    """One request through the capture step, as the gateway's steps hand it over."""
    limits = parse_config({"channels": [{"name": "c", "base_url": "http://u/v1"}]}).limits
    body = decode_messages_body(raw, limits)
    if ch.kind == "openai":
        out = convert(body.typed, ConvertOptions(upstream_model="m"))
    else:
        out = {**body.whole(), "model": "m"}
    rec = _record()
    rec.session_id, _ = session_of_messages(body, {k.lower(): v for k, v in headers.items()})
    cap(rec, body, out, ch, None, raw, msgspec.json.encode(out), orders=RenderOrders())
    return rec


def _record() -> Record:
    return Record(
        request_id="r",
        received_at=0.0,
        endpoint="messages",
        client="claude-cli",
        client_version="2.1.332",
    )


def run(case: str, order="tools_first", kind="openai", sessions=2, turns=4) -> list[Record]:
    cap, ch = Capturer(), channel(order, kind)
    out = []
    for session in bk.sessions(case, bk.spec_for(sessions=sessions, turns=turns)):
        out += [capture(cap, ch, req.content(), req.headers) for req in session]
    return out


@pytest.mark.parametrize("order", ["tools_first", "system_first"])
@pytest.mark.parametrize("case", [c for c in bk.CASES if c != bk.CONTROL])
def test_every_breaker_is_found_with_its_class_and_segment(case, order):
    want = bk.EXPECTED[case]
    changes = [r.change for r in run(case, order) if r.change is not None]
    mine = [c for c in changes if c.scope == want.scope]
    assert mine, f"{case}: no change of scope {want.scope}"
    assert {(c.cls, c.segment) for c in mine} == {(want.cls, want.segment)}
    for c in mine:
        assert 0 <= c.at_tokens < c.prompt_estimate
        assert 0 < c.lost_tokens <= c.prompt_estimate
        assert c.shape is not None and c.shape.cls == want.cls


def test_the_control_has_no_change_and_every_later_request_is_compared():
    recs = run(bk.CONTROL, sessions=3)
    assert all(r.change is None for r in recs)
    firsts = [r for r in recs if r.compared != "session"]
    assert len(firsts) == 3  # each session's first request
    assert [r.compared for r in firsts] == [None, "sessions", "sessions"]


def test_where_the_clock_is():
    recs = run(bk.CLOCK, "system_first")
    c = next(r.change for r in recs if r.change)
    assert c.upstream == "messages[0]:system" and c.kind == "system"
    assert (c.shape.paragraph, c.shape.new_skeleton) == (2, "99:99:99")
    assert c.at_tokens < 200  # system first: the clock sits near the start of the prompt
    tools_first = next(r.change for r in run(bk.CLOCK, "tools_first") if r.change)
    assert tools_first.at_tokens > 15_000  # after the tools


def test_the_billing_header_is_recognised():
    c = next(r.change for r in run(bk.BILLING) if r.change)
    assert c.known == "billing_header"
    assert c.shape.new_skeleton in ("<hex:5>", "99999")


def test_a_date_that_changes_before_anything_is_re_sent_costs_nothing():
    """The second request re-sends nothing that comes after the mid-conversation
    message: no change is recorded until there is history after it."""
    recs = run(bk.MID_DATE, sessions=1, turns=3)
    assert [r.change is not None for r in recs] == [False, False, True]


def test_an_anthropic_channel_compares_hashes_so_moving_markers_are_no_change():
    recs = run(bk.CONTROL, kind="anthropic")
    assert all(r.change is None for r in recs)
    clock = [r.change for r in run(bk.CLOCK, kind="anthropic") if r.change]
    assert clock and clock[0].cls == "time_of_day" and clock[0].segment == "system[1]"


def test_a_side_request_between_two_turns_does_not_hide_the_break():
    """A title-like request (other system prompt, no tools) between turns: each turn is
    compared with the request it shares the most with."""
    cap, ch = Capturer(), channel()
    [session] = bk.sessions(bk.CLOCK, bk.spec_for(sessions=1, turns=4))
    side = session[0].fresh_body()
    side["system"] = [{"type": "text", "text": "Write a five-word title."}]
    side["tools"] = []
    side["messages"] = side["messages"][:1]
    raw_side = msgspec.json.encode(side)
    seen = []
    for req in session:
        seen.append(capture(cap, ch, req.content(), req.headers))
        capture(cap, ch, raw_side, req.headers)
    assert all(r.change and r.change.cls == "time_of_day" for r in seen[1:])


def test_a_chat_request_passed_through():
    cap, ch = Capturer(), channel()
    limits = parse_config({"channels": [{"name": "c", "base_url": "http://u/v1"}]}).limits
    recs = []
    for t in range(3):
        body = {
            "model": "m",
            "messages": [
                {"role": "system", "content": f"Agent.\n\nNow: 2026-08-17 09:12:{10 + t:02d}"},
                *[
                    {"role": r, "content": f"turn {k} " * 400}
                    for k in range(2 * t + 1)
                    for r in ("user",)
                ],
            ],
        }
        raw = msgspec.json.encode(body)
        chat = decode_chat_body(raw, limits)
        rec = Record(request_id=f"r{t}", received_at=0.0, endpoint="chat", session_id="s")
        cap(rec, chat, {**chat, "model": "m"}, ch, None, raw, None, orders=RenderOrders())
        recs.append(rec)
    assert recs[0].change is None
    c = recs[2].change
    assert c.cls == "date_time" and c.segment == "messages[0]:system" and c.kind == "system"


def test_memory_stays_within_the_budget():
    tracker = ChangeTracker(budget=1_500_000)
    cap, ch = Capturer(), channel()
    cap.changes = tracker
    spec = bk.spec_for(sessions=12, turns=2)
    for session in bk.sessions(bk.CLOCK, spec):
        for req in session:
            capture(cap, ch, req.content(), req.headers)
            assert tracker.bytes <= tracker.budget
    assert 0 < len(tracker) < 12  # the least recently active sessions went first


def test_a_budget_of_zero_turns_the_comparison_off():
    cap, ch = Capturer(change_budget=0), channel()
    [session] = bk.sessions(bk.CLOCK, bk.spec_for(sessions=1, turns=3))
    recs = [capture(cap, ch, req.content(), req.headers) for req in session]
    assert all(r.compared is None and r.change is None for r in recs)
    assert all(r.segments_out for r in recs)  # the segments are still captured


def test_the_total_tokens_countdown_in_the_system_prompt_is_recognised():
    """Claude Code versions that count the tokens left down in the system prompt: the
    change is labelled with the catalog's marker (its text is not kept)."""
    cap, ch = Capturer(), channel("system_first")
    recs = []
    for turn in range(3):
        messages = [{"role": "user", "content": "hi"}]
        for t in range(turn):
            messages += [
                {"role": "assistant", "content": f"answer {t}"},
                {"role": "user", "content": f"more {t}"},
            ]
        body = {
            "model": "m",
            "max_tokens": 8,
            "system": [
                {"type": "text", "text": "You are Claude Code. Be brief."},
                {
                    "type": "text",
                    "text": f"<total_tokens>{190000 - 5000 * turn} tokens left</total_tokens>",
                },
            ],
            "messages": messages,
            "metadata": {"user_id": '{"session_id": "s-1"}'},
        }
        recs.append(capture(cap, ch, msgspec.json.encode(body), {}))
    changes = [r.change for r in recs if r.change is not None]
    assert changes and {c.known for c in changes} == {"total_tokens_reminder"}


def _messages_request(messages: list[tuple[str, str]]) -> bytes:
    body = {
        "model": "m",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "You are an agent. " * 50}],
        "metadata": {"user_id": '{"session_id":"s-compact"}'},
        "messages": [{"role": r, "content": t} for r, t in messages],
    }
    return msgspec.json.encode(body)


def test_a_history_that_keeps_the_user_turns_and_drops_the_models_is_a_compaction():
    """Codex's way (and a rewind's): the user messages kept, the model's turns replaced by
    a summary. The prefix breaks where the first answer was, and what follows was sent
    before: a change, of the class that is no breaker."""
    cap, ch = Capturer(), channel()
    u1, u2, u3 = (("user", f"task {n} " * 300) for n in (1, 2, 3))
    before = [u1, ("assistant", "done 1"), u2, ("assistant", "done 2"), u3, ("assistant", "3")]
    after = [u1, u2, u3, ("user", "Summary: the three tasks are done."), ("user", "task 4")]
    edited = [u1, ("assistant", "done 1, edited"), *before[2:]]
    recs = [
        capture(cap, ch, _messages_request(m), {})
        for m in (before, [*before, ("user", "next")], after)
    ]
    assert recs[1].change is None  # appended
    change = recs[2].change
    assert change.cls == "context_compacted" and change.kind == "message"
    assert change.lost_tokens > 0  # the third task came again, after the break
    # an answer edited in place keeps the model's turns: that is a content edit
    cap2 = Capturer()
    first = capture(cap2, ch, _messages_request([*before, ("user", "next")]), {})
    again = capture(cap2, ch, _messages_request([*edited, ("user", "next")]), {})
    assert first.change is None and again.change.cls == "content_edit"


def test_a_compaction_that_sends_nothing_again_is_still_said():
    """Claude Code's way: the history replaced by a summary, nothing after the break sent
    before: no tokens lost, and the record still says the context was compacted."""
    cap, ch = Capturer(), channel()
    u1 = ("user", "task 1 " * 300)
    before = [u1, ("assistant", "done 1"), ("user", "task 2 " * 300)]
    after = [("user", "Summary: task 1 done."), ("user", "task 2, again")]
    first, again = (capture(cap, ch, _messages_request(m), {}) for m in (before, after))
    assert first.change is None
    assert again.change.cls == "context_compacted" and again.change.lost_tokens == 0


# -- Codex's own compaction (Responses, converted to chat): what the pinned Codex sends ---
_TOOL = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command. " * 40,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
_DEV = ("developer", "You are Codex, a coding agent. " * 60)
_ENV = ("user", "<environment_context>cwd /work</environment_context>")
_CHECKPOINT = ("user", "You are performing a CONTEXT CHECKPOINT COMPACTION. " * 8)


def _codex_request(
    items: list[tuple[str, str]], *, summary: bool = False, named: bool = True
) -> bytes:
    """A Codex request: its items, tools (none in its own summary request), and the turn
    metadata it puts in ``client_metadata`` (``request_kind``; left out: not ``named``)."""
    kind = "compaction" if summary else "turn"
    body = {
        "model": "m",
        "input": [
            {"type": "message", "role": r, "content": [{"type": "input_text", "text": t}]}
            if r != "assistant"
            else {"type": "message", "role": r, "content": [{"type": "output_text", "text": t}]}
            for r, t in items
        ],
        "tools": [] if summary else [_TOOL],
        "stream": True,
        "prompt_cache_key": "s-codex",
    }
    if named:
        meta = {"session_id": "s-codex", "request_kind": kind, "window_number": 0}
        body["client_metadata"] = {"x-codex-turn-metadata": msgspec.json.encode(meta).decode()}
    return msgspec.json.encode(body)


def capture_responses(cap: Capturer, ch, raw: bytes) -> Record:
    """One Responses request through the capture step (converted to chat)."""
    limits = parse_config({"channels": [{"name": "c", "base_url": "http://u/v1"}]}).limits
    body = decode_responses_body(raw, limits)
    out = convert_responses(body.typed, ConvertOptions(upstream_model="m"))
    rec = Record(request_id="r", received_at=0.0, endpoint="responses", client="codex_exec")
    rec.session_id, _ = session_of_responses(body, {})
    cap(rec, body, out, ch, None, raw, msgspec.json.encode(out), orders=RenderOrders())
    return rec


def _codex_session(cap: Capturer, *, named: bool = True) -> list[Record]:
    """Three turns with a compaction by Codex's own summary turn before each later one,
    as the pinned Codex sends them through the gateway: the turn after the second one
    re-sends the developer messages split around the first task."""
    ch = channel("system_first")
    n1, n2, n3 = (("user", f"notes {n} " * 300) for n in (1, 2, 3))
    s1, s2 = (("user", f"Another model wrote this summary: {n}") for n in (1, 2))
    skills = ("developer", "<skills_instructions>the skills</skills_instructions>")
    turns = [
        ([_DEV, skills, _ENV, n1], False),
        ([_DEV, skills, _ENV, n1, ("assistant", "OK"), _CHECKPOINT], True),
        ([_DEV, skills, _ENV, n1, s1, n2], False),
        ([_DEV, skills, _ENV, n1, s1, n2, ("assistant", "OK 2"), _CHECKPOINT], True),
        ([_DEV, n1, skills, _ENV, n2, s2, n3], False),
    ]
    return [
        capture_responses(cap, ch, _codex_request(items, summary=summary, named=named))
        for items, summary in turns
    ]


def test_codex_own_summary_turn_and_the_turns_after_it_are_a_compaction_not_a_breaker():
    """Its summary request (named ``request_kind: compaction``) leaves the tools out: the
    prefix breaks after the system prompt, a step of the compaction. The turn after the
    second compaction holds no more of the model's turns than the turn before it, but fewer
    than the summary request just before it, whose user messages it keeps: compacted."""
    recs = _codex_session(Capturer())
    summaries, after = (recs[1], recs[3]), recs[4]
    for rec in summaries:
        assert rec.change is not None and rec.change.cls == "context_compacted", rec.change
        assert rec.change.shape.detail == "the client's summary request of a compaction"
    assert recs[2].change is None or recs[2].change.cls == "context_compacted"
    assert after.change is not None and after.change.lost_tokens > 0
    assert after.change.cls == "context_compacted", after.change
    assert after.change.shape.detail == "the history restarted from a summary"


def test_a_summary_request_the_client_does_not_name_is_a_change_of_the_tools():
    """Without Codex's turn metadata the request without tools is what it is: the tools
    left out (named as the tools, not as the message that came next upstream)."""
    recs = _codex_session(Capturer(), named=False)
    change = recs[1].change
    assert change is not None and change.cls == "content_edit"
    assert (change.segment, change.kind) == ("tools", "tools")
    assert change.shape.detail == "1 tools left out"
    assert change.upstream == "exec_command"


def test_a_side_thread_with_more_model_turns_does_not_hide_a_break_of_the_main_thread():
    """The latest request of the session is another thread's (a sub-agent's, with more of
    the model's turns): the main thread's next turn shares none of its messages, so a
    change it makes is still a breaker."""
    cap, ch = Capturer(), channel("system_first")
    n1 = ("user", "main task " * 300)
    sub = [("user", "sub-agent task " * 200), ("assistant", "a"), ("user", "b"), ("assistant", "c")]
    main = [_DEV, n1, ("assistant", "done")]
    edited = [("developer", _DEV[1] + " Now at 10:42."), n1, ("assistant", "done")]
    recs = [
        capture_responses(cap, ch, _codex_request(m))
        for m in (main, [_DEV, *sub, ("user", "d")], [*edited, ("user", "next")])
    ]
    change = recs[2].change
    assert change is not None and change.cls != "context_compacted", change


@pytest.mark.parametrize(
    ("meta", "named"),
    [
        ({"x-codex-turn-metadata": '{"request_kind":"compaction"}'}, True),
        ({"x-codex-turn-metadata": '{"request_kind":"turn"}'}, False),
        ({"x-codex-turn-metadata": '{"compaction":{"trigger":"auto"}}'}, False),
        ({"x-codex-turn-metadata": "not json: compaction"}, False),
        ({"x-codex-turn-metadata": '"compaction"'}, False),
        ({"request_kind": "compaction"}, False),
        ("compaction", False),
        (None, False),
    ],
)
def test_the_summary_request_is_named_only_by_codex_turn_metadata(meta, named):
    assert summary_request(meta) is named


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("case", bk.CASES)
def test_what_the_previous_turn_lends_changes_nothing_the_capture_finds(case, kind):
    # The gateway decodes and converts a turn lent by the session's previous one
    # (SessionTurns) and the capture takes the decode's parts: every record must be what
    # the turn decoded, converted and captured alone gives.
    from prefixgate.apis.messages.request import SessionTurns

    limits = parse_config({"channels": [{"name": "c", "base_url": "http://u/v1"}]}).limits
    ch, alone, lent, turns = channel(kind=kind), Capturer(), Capturer(), SessionTurns(1 << 26)
    for session in bk.sessions(case, bk.spec_for(sessions=2, turns=5)):
        for req in session:
            raw, headers = req.content(), {k.lower(): v for k, v in req.headers.items()}
            a = capture(alone, ch, raw, req.headers)
            sid = session_of_messages(decode_messages_body(raw, limits), headers)[0]
            body = decode_messages_body(raw, limits, turns, lambda _small, sid=sid: sid)
            assert body.pieces is not None  # lent (a session's first request: nothing)
            if ch.kind == "openai":
                out = turns.convert(("c", sid), body.typed, ConvertOptions("m"), len(raw))
            else:
                out = {**body.whole(), "model": "m"}
            b = _record()
            b.session_id = sid
            lent(b, body, out, ch, None, raw, msgspec.json.encode(out), orders=RenderOrders())
            assert (b.segments_in, b.segments_out) == (a.segments_in, a.segments_out)
            assert (b.compared, b.change) == (a.compared, a.change)


def test_the_pieces_kept_as_sent_are_those_computed_afresh():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from prefixgate.record.changes import _first_difference, _sent
    from prefixgate.record.record import Segment

    segs = [Segment(k, f"{k}{i}", h, 4, 1) for i in range(3) for k in ("message", "system", "tool")
            for h in ("a" * 32, "b" * 32)]  # fmt: skip
    piece = st.tuples(st.sampled_from(segs), st.sampled_from([b"x", b"yy", None]))

    @settings(max_examples=500, deadline=None)
    @given(st.lists(piece, max_size=6), st.lists(piece, max_size=6), st.booleans())
    def check(before, now, by_bytes):
        prev = _sent(before, by_bytes, ())
        fresh = [(s, d if by_bytes and s.kind != "message" else None) for s, d in now]
        got = _sent(now, by_bytes, prev)
        assert got == fresh
        plain = [(s, d if by_bytes and s.kind != "message" else None) for s, d in before]
        assert _first_difference(prev, got) == _first_difference(plain, fresh)

    check()


def test_a_requests_marks_found_once_give_what_its_segments_give():
    """The change memory keeps each request's compaction marks (``marks_of``) instead of
    walking its segments again: either form answers ``compacted`` and ``rewritten`` alike."""
    from prefixgate.record.compacted import compacted, marks_of, rewritten
    from prefixgate.record.record import Segment

    def seg(kind: str, name: str, h: str) -> Segment:
        return Segment(kind, name, h, 4, 1)

    base = [seg("tools", "tools", "t"), seg("system", "system[0]", "s")]
    turns = [
        seg("message", "messages[0]:user", "u0"),
        seg("message", "messages[1]:assistant", "a1"),
        seg("message", "messages[2]:function_call", "f2"),
        seg("message", "messages[3]:reasoning", "r3"),
        seg("message", "messages[4]:compaction", "c4"),
        seg("system", "x:assistant", "not-a-turn"),  # a model turn only as a message
    ]
    shapes = [base + turns[:k] for k in range(len(turns) + 1)]
    shapes.append(base + [turns[0], seg("message", "messages[1]:compaction", "c9")])
    ends = (":assistant", ":function_call", ":custom_tool_call", ":reasoning")

    def model_turns(segs):  # the definition, walked here
        return sum(1 for s in segs if s.kind == "message" and s.name.endswith(ends))

    def by_walk(a, b) -> bool:
        items = lambda segs: {s.hash for s in segs if s.name.endswith(":compaction")}  # noqa: E731
        return bool(items(b) - items(a)) or model_turns(b) < model_turns(a)

    for a in shapes:
        assert marks_of(a).model_turns == model_turns(a)
        for b in shapes:
            assert compacted(marks_of(a), marks_of(b)) == by_walk(a, b)
            assert compacted(a, marks_of(b)) == by_walk(a, b)
            assert rewritten(marks_of(a), a, marks_of(b), b) == rewritten(a, a, b, b)
    assert marks_of(base + turns).model_turns == 3
    assert marks_of(base + turns).compactions == {"c4"}
