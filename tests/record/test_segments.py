"""Segment capture: stable hashes, cache_control ignored, upstream order, first_changed,
redacted texts, and the storage a growing session costs."""

from __future__ import annotations

import copy
import hashlib
import json
import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.record.record import Record
from prefixgate.record.segments import (
    FirstChange,
    canonical_json,
    first_changed,
    prefix_tokens,
    segments_anthropic,
    segments_openai,
    stripped,
    texts_of,
)
from prefixgate.store.sqlite import SqliteStore
from tests.conftest import FIXTURES

FIXTURE = FIXTURES / "01_v2.1.332_print_turn1.json"


@pytest.fixture(scope="module")
def body() -> dict:
    return json.loads(FIXTURE.read_text())["body"]


def reference_hash(obj) -> str:
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def to_openai(body: dict) -> dict:
    """A minimal Anthropic -> OpenAI Chat conversion, enough for segment tests."""
    system = "\n".join(b["text"] for b in body["system"])
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t["input_schema"],
            },
        }
        for t in body["tools"]
    ]
    messages = [{"role": "system", "content": system}]
    for m in body["messages"]:
        text = (
            "".join(b.get("text", "") for b in m["content"])
            if isinstance(m["content"], list)
            else m["content"]
        )
        messages.append({"role": m["role"], "content": text})
    return {"model": "qwen", "tools": tools, "messages": messages}


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_canonical_json_is_the_json_dumps_form(value) -> None:
    expected = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    assert canonical_json(value) == expected.encode()


@pytest.mark.parametrize(
    "x", [1e16, 1e-7, 1e-5, 1.5e300, 0.0001, -0.0, 2.0, 5e-324, math.inf, 2**70]
)
def test_canonical_json_edge_numbers(x) -> None:
    assert canonical_json({"x": x}) == json.dumps({"x": x}, separators=(",", ":")).encode()


def test_hashes_are_the_specified_digest(body: dict) -> None:
    segs = segments_anthropic(body)
    by_name = {s.name: s for s in segs}
    system2 = {k: v for k, v in body["system"][2].items() if k != "cache_control"}
    assert by_name["system[2]"].hash == reference_hash(system2)
    plain = [{k: v for k, v in t.items() if k != "cache_control"} for t in body["tools"]]
    assert by_name["tools"].hash == reference_hash(plain)
    assert by_name["Bash"].hash == reference_hash(next(t for t in plain if t["name"] == "Bash"))
    text = json.dumps(system2, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    assert by_name["system[2]"].chars == len(text)
    assert by_name["system[2]"].tokens == math.ceil(len(text) / 4)
    assert segments_anthropic(copy.deepcopy(body)) == segs  # stable


def test_anthropic_order_and_names(body: dict) -> None:
    segs = segments_anthropic(body)
    n_sys, n_tools, n_msg = len(body["system"]), len(body["tools"]), len(body["messages"])
    kinds = [s.kind for s in segs]
    assert kinds == ["system"] * n_sys + ["tools"] + ["tool"] * n_tools + ["message"] * n_msg
    assert [s.name for s in segs[:n_sys]] == [f"system[{i}]" for i in range(n_sys)]
    assert [s.name for s in segs[n_sys + 1 : n_sys + 1 + n_tools]] == [
        t["name"] for t in body["tools"]
    ]
    assert segs[-n_msg].name == f"messages[0]:{body['messages'][0]['role']}"
    first = segments_anthropic(body, tools_first=True)
    assert [s.kind for s in first][: n_tools + 1] == ["tools"] + ["tool"] * n_tools
    assert sorted(first, key=lambda s: s.name) == sorted(segs, key=lambda s: s.name)


def test_string_system_is_one_segment() -> None:
    segs = segments_anthropic(
        {"system": "be brief", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert [(s.kind, s.name) for s in segs] == [
        ("system", "system"),
        ("message", "messages[0]:user"),
    ]


def test_cache_control_is_ignored(body: dict) -> None:
    moved = copy.deepcopy(body)
    for block in moved["system"]:
        block.pop("cache_control", None)
    moved["system"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    moved["tools"][-1]["cache_control"] = {"type": "ephemeral"}
    for m in moved["messages"]:
        for block in m["content"] if isinstance(m["content"], list) else []:
            block["cache_control"] = {"type": "ephemeral"}
    moved["messages"].append(
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [
                        {"type": "text", "text": "ok", "cache_control": {"type": "ephemeral"}}
                    ],
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        }
    )
    plain = copy.deepcopy(moved)
    plain["messages"][-1]["content"][0].pop("cache_control")
    plain["messages"][-1]["content"][0]["content"][0].pop("cache_control")
    assert segments_anthropic(moved)[:-1] == segments_anthropic(body)
    assert segments_anthropic(moved) == segments_anthropic(plain)
    assert "cache_control" in moved["system"][0]  # the body itself is left alone


def test_cache_control_inside_a_tool_schema_is_content() -> None:
    def tool(props):
        return {"name": "t", "input_schema": {"type": "object", "properties": props}}

    a = segments_anthropic({"tools": [tool({"cache_control": {"type": "string"}})]})
    b = segments_anthropic({"tools": [tool({})]})
    assert a[0].hash != b[0].hash


def test_first_changed_on_billing_header_change(body: dict) -> None:
    turn2 = copy.deepcopy(body)
    turn2["system"][0]["text"] = body["system"][0]["text"].replace("0b8", "1c9")
    prev, cur = segments_anthropic(body), segments_anthropic(turn2)
    change = first_changed(prev, cur)
    assert change == FirstChange(index=0, offset=0)
    assert cur[change.index].name == "system[0]"

    o_prev = segments_openai(to_openai(body), tools_first=True)
    o_cur = segments_openai(to_openai(turn2), tools_first=True)
    change = first_changed(o_prev, o_cur)
    assert o_cur[change.index].name == "messages[0]:system"
    tools = next(s for s in o_cur if s.kind == "tools")
    assert change.offset == tools.tokens
    assert change.offset == prefix_tokens(o_cur[: change.index])

    o_prev = segments_openai(to_openai(body), tools_first=False)
    o_cur = segments_openai(to_openai(turn2), tools_first=False)
    assert first_changed(o_prev, o_cur) == FirstChange(index=0, offset=0)


def test_first_changed_growing_and_positional(body: dict) -> None:
    segs = segments_anthropic(body)
    grown = copy.deepcopy(body)
    grown["messages"].append({"role": "assistant", "content": [{"type": "text", "text": "done"}]})
    assert first_changed(segs, segments_anthropic(grown)) is None
    assert first_changed(segments_anthropic(grown), segs) is None
    assert first_changed(segs, segs) is None
    edited = copy.deepcopy(body)
    edited["messages"][1]["content"][0]["text"] += " (edited)"
    cur = segments_anthropic(edited)
    change = first_changed(segs, cur)
    assert change.index == len(segs) - 1
    assert change.offset == sum(s.tokens for s in segs[:-1] if s.kind != "tool")


def test_openai_order() -> None:
    req = {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "messages": [
            {"role": "system", "content": "a"},
            {"role": "developer", "content": "b"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "c", "cache_control": {"type": "ephemeral"}}],
            },
            {"role": "system", "content": "mid-conversation"},
        ],
    }
    names = [(s.kind, s.name) for s in segments_openai(req)]
    assert names == [
        ("tools", "tools"),
        ("tool", "f"),
        ("system", "messages[0]:system"),
        ("system", "messages[1]:developer"),
        ("message", "messages[2]:user"),
        ("message", "messages[3]:system"),
    ]
    after = [s.name for s in segments_openai(req, tools_first=False)]
    assert after[:4] == ["messages[0]:system", "messages[1]:developer", "tools", "f"]
    plain = copy.deepcopy(req)
    del plain["messages"][2]["content"][0]["cache_control"]
    assert segments_openai(plain) == segments_openai(req)


def test_texts_are_redacted_but_hashes_are_of_the_original() -> None:
    secret = "sk-ant-api03-" + "A1b2C3d4" * 6
    req = {"messages": [{"role": "user", "content": f"my key is {secret}, use it"}]}
    (seg,) = segments_anthropic(req)
    assert seg.hash == reference_hash(req["messages"][0])
    texts = texts_of(req)
    assert list(texts) == [seg.hash]
    assert secret not in texts[seg.hash]
    assert "<redacted>" in texts[seg.hash]
    json.loads(texts[seg.hash])  # still JSON
    assert texts_of(req, known={seg.hash}) == {}
    filled: dict[str, str] = {}
    assert segments_anthropic(req, texts=filled) == [seg] and filled == texts


def test_texts_cover_every_segment(body: dict) -> None:
    texts = texts_of(body)
    assert set(texts) == {s.hash for s in segments_anthropic(body)}
    o = to_openai(body)
    assert set(texts_of(o, api="openai")) == {s.hash for s in segments_openai(o)}
    with pytest.raises(ValueError):
        texts_of(body, api="gemini")


def test_growing_session_is_stored_compactly(body: dict, tmp_path) -> None:
    """Content addressing: a session's texts are stored once, not once per turn. (The
    1,000-turn figure is in benchmarks/record_capture.py; 150 turns keep this test quick.)"""
    store = SqliteStore(tmp_path / "s.db")
    store.migrate()
    session = copy.deepcopy(body)
    raw = 0
    known: set[str] = set()
    for k in range(150):
        if k:
            session["messages"].append(
                {"role": "assistant", "content": [{"type": "text", "text": f"step {k} " * 40}]}
            )
            session["messages"].append(
                {"role": "user", "content": [{"type": "text", "text": f"output {k} " * 200}]}
            )
        raw += len(json.dumps(session, ensure_ascii=False, separators=(",", ":")).encode())
        texts: dict[str, str] = {}
        segs = segments_anthropic(session, texts=texts, known=known)
        known.update(texts)
        store.write_batch(
            [
                Record(
                    request_id=str(k),
                    received_at=float(k),
                    segments_in=segs,
                    segments_out=segs,
                    texts=texts,
                )
            ]
        )
    store.close()
    stored = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert stored <= 0.10 * raw


def test_float_walk_flags_exactly_the_objects_msgspec_writes_differently():
    import msgspec
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from prefixgate.record.segments import floats_differ

    floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
        [1e16, 1e-7, 0.00001, 1.5, -0.0, 123456789.0, 1e22, 5e-324]
    )
    leaves = st.none() | st.booleans() | st.integers() | floats | st.text(max_size=8)
    values = st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
        max_leaves=12,
    )

    @settings(max_examples=500, deadline=None)
    @given(values)
    def check(value):
        fast = msgspec.json.Encoder(order="sorted").encode(value)
        slow = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        assert floats_differ(value) == (fast != slow.encode("utf-8", "surrogatepass"))

    check()


def test_digest_memo_gives_the_same_segments_and_keeps_to_its_budget():
    from prefixgate.record import segments as seg

    big = {
        "system": [{"type": "text", "text": "s" * 5000}],
        "tools": [{"name": f"t{i}", "description": "d" * 3000} for i in range(4)],
        "messages": [{"role": "user", "content": "é" * 4000}, {"role": "user", "content": "x"}],
    }
    saved = seg.DIGESTS
    try:
        seg.DIGESTS = seg._Digests(budget=0)  # nothing kept: the reference
        reference = segments_anthropic(big)
        memo = seg.DIGESTS = seg._Digests(budget=1 << 20)
        cold = segments_anthropic(big)
        warm = segments_anthropic(json.loads(json.dumps(big)))  # equal content, new objects
        assert cold == warm == reference
        assert memo._bytes > 0
        small = seg.DIGESTS = seg._Digests(budget=10_000)
        assert segments_anthropic(big) == reference
        assert small._bytes <= 10_000 and len(small._d) == 1  # the least recently used went
    finally:
        seg.DIGESTS = saved


# -- from the request bytes: the same segments as from the decoded object ----------------
def _both_ways(body: dict, api: str, tools_first: bool | None = None):
    from prefixgate.record.cut import segments_from_bytes

    first = api == "openai" if tools_first is None else tools_first
    by_object = (segments_anthropic if api == "anthropic" else segments_openai)(
        body, tools_first=first
    )
    raw = json.dumps(body).encode()
    return by_object, segments_from_bytes(raw, api, tools_first=tools_first)


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.json")))
@pytest.mark.parametrize("tools_first", [False, True])
def test_segments_from_bytes_equal_the_object_way_on_claude_code_requests(name, tools_first):
    from prefixgate.apis.messages.request import ConvertOptions, anthropic_to_openai

    body = json.loads((FIXTURES / name).read_text())["body"]
    body = json.loads(body) if isinstance(body, str) else body
    for _ in range(2):  # cold, then every piece seen before
        by_object, by_bytes = _both_ways(body, "anthropic", tools_first)
        assert by_bytes == by_object
    chat = anthropic_to_openai(body, ConvertOptions(upstream_model="m"))
    for _ in range(2):
        by_object, by_bytes = _both_ways(chat, "openai", tools_first)
        assert by_bytes == by_object


def test_segments_from_bytes_follow_a_growing_session_and_moving_markers(body):
    from prefixgate.record.cut import segments_from_bytes

    turn = copy.deepcopy(body)
    for k in range(4):
        turn["messages"].append(
            {"role": "assistant", "content": [{"type": "text", "text": f"a{k}"}]}
        )
        turn["messages"].append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"u{k}", "cache_control": {"type": "ephemeral"}}
                ],
            }
        )
        if k:  # the marker moved: the previous user turn lost it
            turn["messages"][-3]["content"][0].pop("cache_control", None)
        raw = json.dumps(turn).encode()
        assert segments_from_bytes(raw, "anthropic") == segments_anthropic(turn)


def test_segments_from_bytes_decline_other_shapes_and_agree_on_odd_ones():
    from prefixgate.record.cut import segments_from_bytes

    declined = [
        {"tools": {"name": "x"}, "messages": []},
        {"messages": {"role": "user"}},
        {"system": 5, "messages": []},
    ]
    for b in declined:
        assert segments_from_bytes(json.dumps(b).encode(), "anthropic") is None
    odd = [
        {"messages": None, "tools": None, "system": None},
        {"messages": [1, "x", None, {"role": 7}], "tools": [{"description": "no name"}, 3]},
        {"tools": [{"name": ""}, {"function": {"name": "f"}}], "messages": []},
        {"system": "one string", "messages": [{"role": "user", "content": "hi"}]},
        {"messages": [{"role": "system", "content": "s"}, {"role": "developer", "content": "d"}]},
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {}}]}
            ]
        },
        {"messages": [{"role": "user", "content": "f", "x": 1e16, "y": 1.5}]},
    ]
    for b in odd:
        for api in ("anthropic", "openai"):
            by_object, by_bytes = _both_ways(b, api)
            assert by_bytes == by_object, (b, api)


def test_segments_from_bytes_match_on_generated_bodies():
    scalars = (
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6)
    )
    blocks = st.dictionaries(
        st.sampled_from(["type", "text", "cache_control", "name", "input", "content"]),
        scalars | st.lists(scalars, max_size=3),
        max_size=4,
    )
    messages = st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer"])},
            optional={"content": st.text(max_size=8) | st.lists(blocks, max_size=3)},
        ),
        max_size=5,
    )
    tools = st.lists(
        st.dictionaries(
            st.sampled_from(["name", "description", "input_schema", "function", "cache_control"]),
            scalars | blocks,
            max_size=3,
        ),
        max_size=3,
    )
    bodies = st.fixed_dictionaries(
        {"messages": messages},
        optional={"tools": tools, "system": st.text(max_size=8) | st.lists(blocks, max_size=2)},
    )

    @settings(max_examples=300, deadline=None)
    @given(bodies, st.sampled_from(["anthropic", "openai"]))
    def check(b, api):
        by_object, by_bytes = _both_ways(b, api)
        assert by_bytes is None or by_bytes == by_object

    check()


def test_a_tools_list_seen_before_is_looked_up_whole_and_a_changed_tool_shows():
    from prefixgate.record.cut import segments_from_bytes

    tools = [
        {"name": f"t{i}", "description": "d" * 300 + str(i), "input_schema": {"type": "object"}}
        for i in range(6)
    ]
    body = {"tools": tools, "messages": [{"role": "user", "content": "hi"}]}
    raw = json.dumps(body).encode()
    first = segments_from_bytes(raw, "anthropic")
    first.append("poison")  # the caller's list is its own: the memo keeps a copy
    again = segments_from_bytes(raw, "anthropic")
    assert again == segments_anthropic(body) and "poison" not in again
    changed = copy.deepcopy(body)
    changed["tools"][3]["description"] += " (edited)"
    after = segments_from_bytes(json.dumps(changed).encode(), "anthropic")
    assert after == segments_anthropic(changed)
    differ = [a.name for a, b in zip(again, after, strict=True) if a.hash != b.hash]
    assert differ == ["tools", "t3"]


# -- one cut, and the session's previous request lending what did not change -------------
def _cut_checked(body: dict, api: str, previous=None):
    """The cut of ``body`` (lent ``previous``), checked against the object way; for an
    Anthropic body also cut from its parts as the decode lends them (going on from
    ``previous`` where it was cut so too), which is what is returned then."""
    from prefixgate.record.cut import cut_from_bytes, cut_from_pieces, pieces_of

    raw = json.dumps(body).encode()
    cut = cut_from_bytes(raw, api, previous=previous)
    if api == "anthropic":
        top = msgspec.json.decode(raw, type=dict[str, msgspec.Raw])
        parts = tuple(bytes(top.get(k, b"null")) for k in ("tools", "system"))
        listed = top.get("messages", b"null")
        raws = msgspec.json.decode(listed, type=list[msgspec.Raw] | None) or []
        messages = [bytes(m) for m in raws]
        from_parts = cut_from_pieces((*parts, messages), api, previous=previous)
        if cut is not None and from_parts is not None:
            assert from_parts == cut
            cut = from_parts
    if cut is None:
        return None
    segs, pieces = cut
    by_object = (segments_anthropic if api == "anthropic" else segments_openai)(
        body, tools_first=api == "openai"
    )
    assert segs == by_object
    assert pieces == pieces_of(raw, segs)
    return cut


def test_a_cut_lent_the_previous_turn_equals_a_fresh_one_through_a_claude_code_session():
    from prefixgate.lab.traffic.claude_code import ClaudeCodeSession
    from prefixgate.lab.traffic.spec import AGENT_CLAUDE_CODE, TrafficSpec

    spec = TrafficSpec(
        sessions=1, turns=12, titles=False, compact_chars=60_000, mix={AGENT_CLAUDE_CODE: 1.0}
    )
    previous = None
    lent = 0
    for req in ClaudeCodeSession(spec, 3).requests():
        cut = _cut_checked(req.body, "anthropic", previous)
        if previous is not None:
            before = {id(d) for _, d in previous}
            lent += sum(id(d) in before for _, d in cut[1])
        previous = cut[1]
    assert lent > 100  # the history, the tools and the system blocks were taken as they were


def test_a_cut_sees_every_change_against_the_previous_request():
    turn = {
        "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        "tools": [{"name": f"t{i}", "description": "d" * 50} for i in range(3)],
        "messages": [{"role": "user", "content": f"m{i}" * 40} for i in range(4)],
    }
    first = _cut_checked(turn, "anthropic")[1]
    edits = [
        lambda b: b["messages"][1].update(content="edited"),
        lambda b: b["tools"].reverse(),
        lambda b: b["tools"][1].update(description="other"),
        lambda b: b["system"][0].update(text="clock 12:01"),
        lambda b: b.update(system="one string"),
        lambda b: b["messages"].insert(0, {"role": "assistant", "content": "x"}),
        lambda b: b["messages"].pop(2),
        lambda b: b.pop("tools"),
        lambda b: b["messages"][0].update(role="system"),
    ]
    for edit in edits:
        changed = copy.deepcopy(turn)
        edit(changed)
        for api in ("anthropic", "openai"):
            _cut_checked(changed, api, first)


def test_a_cut_lent_any_previous_request_matches_on_generated_bodies():
    scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=4)
    blocks = st.dictionaries(
        st.sampled_from(["type", "text", "cache_control", "name"]), scalars, max_size=3
    )
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "developer"])},
        optional={"content": st.text(max_size=4) | st.lists(blocks, max_size=2)},
    )
    bodies = st.fixed_dictionaries(
        {"messages": st.lists(message, max_size=4)},
        optional={
            "tools": st.lists(
                st.fixed_dictionaries({"name": st.sampled_from(["a", "b"])}), max_size=2
            ),
            "system": st.text(max_size=3) | st.lists(blocks, max_size=2),
        },
    )

    @settings(max_examples=300, deadline=None)
    @given(bodies, bodies, st.sampled_from(["anthropic", "openai"]))
    def check(before, body, api):
        previous = _cut_checked(before, api)
        # the new body shares a prefix of messages with the previous one, as a session does
        body = {**body, "messages": before["messages"][:2] + body["messages"]}
        _cut_checked(body, api, None if previous is None else previous[1])

    check()


# -- the chat request the gateway built, lent by the conversion ----------------------------
def test_a_chat_cut_lent_by_the_conversion_equals_a_fresh_one_through_edits():
    from prefixgate.apis.messages.request import ConvertOptions, SessionTurns
    from prefixgate.config import Limits
    from prefixgate.lab.traffic.claude_code import ClaudeCodeSession
    from prefixgate.lab.traffic.spec import AGENT_CLAUDE_CODE, TrafficSpec
    from prefixgate.protocol.messages_body import decode_messages_body
    from prefixgate.record.cut import cut_of_chat

    spec = TrafficSpec(
        sessions=1, turns=12, titles=False, compact_chars=60_000, mix={AGENT_CLAUDE_CODE: 1.0}
    )
    bodies = [req.body for req in ClaudeCodeSession(spec, 5).requests()]
    edits = [  # turn k: what the client did to its history
        lambda b: b["messages"][0]["content"].append({"type": "text", "text": "edited"}),
        lambda b: b["messages"].insert(1, {"role": "system", "content": "moved here"}),
        lambda b: b["messages"].pop(2),
        lambda b: b.update(tools=b.get("tools", [])[::-1]),
        lambda b: b.update(system="another system prompt"),
        lambda b: b["messages"].insert(0, {"role": "system", "content": "now it leads"}),
    ]
    for k, edit in zip(range(3, len(bodies), 2), edits, strict=False):
        bodies[k] = copy.deepcopy(bodies[k])
        edit(bodies[k])
    turns, opts = SessionTurns(1 << 30), ConvertOptions("u")
    previous, lent = None, 0
    for body in bodies:
        out = turns.convert(("ch", "s"), decode_messages_body(json.dumps(body).encode(), Limits()).typed, opts, 1)  # fmt: skip
        for tools_first in (True, False):
            segs, pieces, cut = cut_of_chat(out, tools_first=tools_first, previous=previous)
            fresh = cut_of_chat(out, tools_first=tools_first)
            assert (segs, pieces) == fresh[:2]
            assert segs == segments_openai(
                json.loads(msgspec.json.encode(out)), tools_first=tools_first
            )
        if previous is not None:
            lent += sum(a is b for a, b in zip(previous.pieces, cut.pieces, strict=False))
        previous = cut
    assert lent > 50  # what the conversion lent, the cut took as it was


def test_a_lent_chat_message_that_leads_now_is_cut_as_a_fresh_one():
    from prefixgate.record.cut import cut_of_chat

    b = {"role": "system", "content": "b" * 300}
    tools = [{"type": "function", "function": {"name": "t", "parameters": {}}}]
    first = {"messages": [{"role": "user", "content": "a"}, b], "tools": tools}
    now = {"messages": [{"role": "system", "content": "c"}, b], "tools": tools}
    previous = cut_of_chat(first)[2]
    got = cut_of_chat(now, previous=previous)
    assert got[2].pieces[1][0] is previous.pieces[1][0]  # lent
    assert got[:2] == cut_of_chat(now)[:2]
    assert got[1][-1] == (got[0][-1], msgspec.json.encode(b))  # its bytes, as it leads


def test_a_chat_cut_gives_the_previous_turns_very_segments_as_far_as_they_are_equal():
    """What the next stages take by identity (the ledger's block names, the change
    memory's comparisons) ends at the first segment that is a new object: none is made
    anew for a piece that did not change, the leading system message's included."""
    from prefixgate.apis.messages.request import ConvertOptions, SessionTurns
    from prefixgate.config import Limits
    from prefixgate.lab.traffic.claude_code import ClaudeCodeSession
    from prefixgate.lab.traffic.spec import AGENT_CLAUDE_CODE, TrafficSpec
    from prefixgate.protocol.messages_body import decode_messages_body
    from prefixgate.record.cut import cut_of_chat
    from prefixgate.sequences import common_prefix, same_prefix

    spec = TrafficSpec(sessions=1, turns=8, titles=False, mix={AGENT_CLAUDE_CODE: 1.0})
    turns, opts = SessionTurns(1 << 30), ConvertOptions("u")
    for tools_first in (True, False):
        previous, before = None, None
        for req in ClaudeCodeSession(spec, 7).requests():
            typed = decode_messages_body(json.dumps(req.body).encode(), Limits()).typed
            out = turns.convert(("ch", "s"), typed, opts, 1)
            segs, _, previous = cut_of_chat(out, tools_first=tools_first, previous=previous)
            if before is not None:
                assert any(s.kind == "system" for s in segs)
                assert same_prefix(segs, before) == common_prefix(segs, before) > 10
            before = segs


def _reference_canonical(data: bytes) -> bytes:
    """A piece's canonical JSON the long way: decoded by the standard library, stripped,
    dumped sorted and compact."""
    text = json.dumps(
        stripped(json.loads(data)), sort_keys=True, ensure_ascii=False, separators=(",", ":")
    )
    return text.encode("utf-8", "surrogatepass")


def test_a_piece_is_made_canonical_however_its_json_is_written():
    """``canonical_of`` skips the float walk when the decode met no float: the same
    canonical JSON as the long way for floats msgspec writes otherwise, a
    ``cache_control`` key spelled with an escape, escaped text and integers past 64 bits."""
    from prefixgate.record.segments import canonical_of

    cases = [
        b'{"role":"user","content":[{"type":"text","text":"x","cache\\u005fcontrol":{}}]}',
        b'{"role":"user","cache\\u005Fcontrol":{"type":"ephemeral"},"content":"x"}',
        b'{"role":"user","content":"caf\\u00e9 \\"q\\" \\/","cache_control":{}}',
        b'{"role":"user","content":[{"type":"text","text":"n","x":1e16,"y":1e-7,"z":2.0}]}',
        b'{"role":"assistant","content":[{"type":"tool_use","input":{"n":1234567890123456789012}}]}',
        b'{"role":"user","content":"plain"}',
        b'"a system string"',
    ]
    for data in cases:
        obj, canonical = canonical_of(data)
        assert obj == json.loads(data)
        assert canonical == _reference_canonical(data), data


def test_a_piece_is_made_canonical_on_generated_json():
    from prefixgate.record.segments import canonical_of

    scalars = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=6)
    )
    blocks = st.dictionaries(
        st.sampled_from(["type", "text", "cache_control", "input", "content"]),
        scalars | st.lists(scalars, max_size=3),
        max_size=4,
    )
    messages = st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "tool"])},
        optional={
            "content": st.text(max_size=8) | st.lists(blocks, max_size=3),
            "cache_control": st.just({"type": "ephemeral"}),
        },
    )

    @settings(max_examples=300, deadline=None)
    @given(messages, st.booleans(), st.booleans())
    def check(message, ascii_only, escaped_key):
        data = json.dumps(message, ensure_ascii=ascii_only).encode()
        if escaped_key:
            data = data.replace(b'"cache_control"', b'"cache\\u005fcontrol"')
        assert canonical_of(data)[1] == _reference_canonical(data)

    check()
