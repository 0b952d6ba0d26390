"""Property tests (hypothesis) for both converters."""

from __future__ import annotations

import copy
import json

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.apis.messages.request import ConvertOptions, anthropic_to_openai, system_text
from prefixgate.apis.messages.stream import AnthropicStream

OPTS = ConvertOptions(upstream_model="up")
text = st.text(min_size=0, max_size=40)
ident = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ident, inner, max_size=3),
    max_leaves=8,
)


@st.composite
def turn_pair(draw):
    """An assistant turn with tool calls and the user turn with their results."""
    n = draw(st.integers(0, 3))
    ids = [f"toolu_{i}_{draw(ident)}" for i in range(n)]
    assistant = []
    if draw(st.booleans()):
        assistant.append({"type": "thinking", "thinking": draw(text), "signature": "sig"})
    if draw(st.booleans()) or n == 0:
        assistant.append({"type": "text", "text": draw(text)})
    for i in ids:
        assistant.append(
            {
                "type": "tool_use",
                "id": i,
                "name": draw(ident),
                "input": draw(st.dictionaries(ident, json_value, max_size=3)),
            }
        )
    user = []
    for i in ids:
        content = draw(
            st.one_of(
                text, st.lists(st.builds(lambda t: {"type": "text", "text": t}, text), max_size=2)
            )
        )
        user.append(
            {
                "type": "tool_result",
                "tool_use_id": i,
                "content": content,
                "is_error": draw(st.booleans()),
            }
        )
    user.append({"type": "text", "text": draw(text)})
    return [{"role": "assistant", "content": assistant}, {"role": "user", "content": user}]


@st.composite
def messages_request(draw):
    messages = [{"role": "user", "content": draw(text)}]
    if draw(st.booleans()):
        messages.append({"role": "system", "content": [{"type": "text", "text": draw(text)}]})
    for _ in range(draw(st.integers(0, 3))):
        messages += draw(turn_pair())
    body = {"model": "m", "max_tokens": draw(st.integers(1, 100000)), "messages": messages}
    if draw(st.booleans()):
        body["system"] = [
            {"type": "text", "text": draw(text)} for _ in range(draw(st.integers(1, 3)))
        ]
    if draw(st.booleans()):
        body["tools"] = [
            {
                "name": draw(ident),
                "description": draw(text),
                "input_schema": {"type": "object", "properties": {}},
            }
            for _ in range(draw(st.integers(1, 3)))
        ]
    body["stream"] = draw(st.booleans())
    return body


def _sprinkle_cache_control(body: dict) -> dict:
    out = copy.deepcopy(body)
    for b in out.get("system") or []:
        b["cache_control"] = {"type": "ephemeral"}
    for m in out["messages"]:
        if isinstance(m["content"], list) and m["content"]:
            m["content"][-1]["cache_control"] = {"type": "ephemeral", "ttl": "5m"}
    for t in out.get("tools") or []:
        t["cache_control"] = {"type": "ephemeral"}
    out["context_management"] = {"edits": []}
    out["output_config"] = {"effort": "high"}
    return out


@settings(max_examples=200, deadline=None)
@given(messages_request())
def test_request_conversion_is_deterministic_and_ignores_cache_markers(body):
    a = msgspec.json.encode(anthropic_to_openai(body, OPTS))
    b = msgspec.json.encode(anthropic_to_openai(copy.deepcopy(body), OPTS))
    c = msgspec.json.encode(anthropic_to_openai(_sprinkle_cache_control(body), OPTS))
    assert a == b == c
    assert b"cache_control" not in c or b"cache_control" in msgspec.json.encode(body)


@settings(max_examples=200, deadline=None)
@given(messages_request())
def test_request_conversion_keeps_every_call_and_result(body):
    out = anthropic_to_openai(body, OPTS)
    calls = [
        c["id"]
        for m in out["messages"]
        if m["role"] == "assistant"
        for c in m.get("tool_calls", [])
    ]
    results = [m["tool_call_id"] for m in out["messages"] if m["role"] == "tool"]
    uses = [
        b["id"]
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_use"
    ]
    assert calls == uses == results
    # Mid-conversation system messages stay in place (never hoisted).
    in_roles = [m["role"] for m in body["messages"]]
    if "system" in in_roles[1:]:
        idx = in_roles.index("system")
        offset = 1 if system_text(body.get("system")) else 0
        assert out["messages"][idx + offset]["role"] == "system"
    for m in out["messages"]:
        if m["role"] == "assistant":
            for c in m.get("tool_calls", []):
                json.loads(c["function"]["arguments"])


@settings(max_examples=100, deadline=None)
@given(messages_request(), st.data())
def test_extending_a_conversation_extends_the_upstream_prefix(body, data):
    more = data.draw(turn_pair())
    longer = {**body, "messages": body["messages"] + more}
    short_msgs = anthropic_to_openai(body, OPTS)["messages"]
    long_msgs = anthropic_to_openai(longer, OPTS)["messages"]
    assert long_msgs[: len(short_msgs)] == short_msgs


# -- the stream state machine -------------------------------------------------------------
piece = st.one_of(
    st.tuples(st.just("text"), st.text(min_size=1, max_size=10)),
    st.tuples(st.just("reasoning"), st.text(min_size=1, max_size=10)),
    st.tuples(st.just("tool"), st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=4)),
)


def _parse_sse(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ")
        name, data = lines[0][7:], json.loads(lines[1][6:])
        assert data["type"] == name
        out.append((name, data))
    return out


@settings(max_examples=300, deadline=None)
@given(
    st.lists(piece, max_size=8), st.sampled_from(["stop", "length", "tool_calls"]), st.booleans()
)
def test_stream_state_machine_emits_a_valid_anthropic_sequence(pieces, finish, usage_in_last):
    conv = AnthropicStream(model="m")
    raw = conv.start()
    expected: list[tuple[str, str]] = []  # (kind, content) per block
    tool_index = 0
    for kind, content in pieces:
        if kind == "tool":
            raw += conv.feed(
                {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {
                                "tool_calls": [
                                    {
                                        "index": tool_index,
                                        "id": f"c{tool_index}",
                                        "function": {"name": f"t{tool_index}", "arguments": ""},
                                    }
                                ]
                            },
                        }
                    ]
                }
            )
            for frag in content:
                raw += conv.feed(
                    {
                        "choices": [
                            {
                                "index": 0,
                                "delta": {
                                    "tool_calls": [
                                        {"index": tool_index, "function": {"arguments": frag}}
                                    ]
                                },
                            }
                        ]
                    }
                )
            expected.append(("tool_use", "".join(content)))
            tool_index += 1
        else:
            key = "content" if kind == "text" else "reasoning_content"
            raw += conv.feed({"choices": [{"index": 0, "delta": {key: content}}]})
            block = "text" if kind == "text" else "thinking"
            if expected and expected[-1][0] == block:
                expected[-1] = (block, expected[-1][1] + content)
            else:
                expected.append((block, content))
    last = {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 64},
    }
    if usage_in_last:
        last["usage"] = usage
    raw += conv.feed(last)
    if not usage_in_last:
        raw += conv.feed({"choices": [], "usage": usage})
    raw += conv.finish()

    events = _parse_sse(raw)
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert events[0][1]["message"]["usage"]["input_tokens"] == 0
    blocks: list[list] = []
    open_index = None
    for name, data in events[1:-2]:
        if name == "ping":
            continue
        if name == "content_block_start":
            assert open_index is None
            open_index = data["index"]
            assert open_index == len(blocks)
            cb = data["content_block"]
            blocks.append([cb["type"], ""])
        elif name == "content_block_delta":
            assert data["index"] == open_index
            d = data["delta"]
            blocks[-1][1] += d.get("text") or d.get("thinking") or d.get("partial_json") or ""
        elif name == "content_block_stop":
            assert data["index"] == open_index
            open_index = None
        else:
            raise AssertionError(name)
    assert open_index is None
    assert [tuple(b) for b in blocks] == expected
    delta = events[-2][1]
    assert delta["usage"]["input_tokens"] == 36 and delta["usage"]["cache_read_input_tokens"] == 64
    want = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}[finish]
    if tool_index and finish == "stop":
        want = "tool_use"
    assert delta["delta"]["stop_reason"] == want
