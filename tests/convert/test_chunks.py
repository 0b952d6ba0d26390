"""The chunk walk both stream converters share: what is not of the expected type in a chat
chunk is skipped by each alike, and the rest converted as if it had not been there."""

from __future__ import annotations

import json

import pytest

from prefixgate.apis.messages.stream import AnthropicStream
from prefixgate.apis.responses.stream import ResponsesStream


def _anthropic():
    return AnthropicStream(model="m")


def _responses():
    return ResponsesStream({"id": "resp_1", "object": "response", "model": "m"}, {})


def _without_ids(raw: bytes) -> str:
    """The stream's events as JSON, with the ids drawn at random replaced by ``<id>``."""
    events = [json.loads(b.split("\ndata: ", 1)[1]) for b in raw.decode().split("\n\n") if b]
    text = json.dumps(events, sort_keys=True)
    for prefix in ('"msg_', '"rs_', '"fc_', '"call_', '"toolu_'):
        while prefix in text:
            start = text.index(prefix)
            end = text.index('"', start + 1)
            text = text[:start] + '"<id>' + text[end:]
    return text


def _run(make, chunks: list[dict]) -> str:
    conv = make()
    raw = conv.start() + b"".join(conv.feed(c) for c in chunks) + conv.finish()
    return _without_ids(raw)


def _chunk(delta: dict, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


CLEAN = [
    _chunk({"reasoning_content": "thinking"}),
    _chunk({"content": "Hello"}),
    _chunk({"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f"}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]}),
    _chunk({}, "tool_calls"),
]
DIRTY = [
    {"choices": ["not an object", *_chunk({"reasoning_content": "thinking"})["choices"]]},
    _chunk({"content": "Hello", "reasoning": ["a list"]}),
    _chunk({"content": True}),
    _chunk({"tool_calls": ["x", 5, {"index": 0, "id": "call_1", "function": {"name": "f"}}]}),
    _chunk({"reasoning_content": 7, "tool_calls": [None]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]}),
    {"choices": [{"index": 0, "finish_reason": "tool_calls"}]},  # no delta at all
]


@pytest.mark.parametrize("make", [_anthropic, _responses], ids=["anthropic", "responses"])
def test_what_is_not_of_the_expected_type_is_skipped(make) -> None:
    assert _run(make, DIRTY) == _run(make, CLEAN)


SGLANG_END = {
    # SGLang names the stop string it ended at ``matched_stop`` (vLLM: ``stop_reason``) and
    # counts reasoning tokens in a top-level ``reasoning_tokens``
    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "matched_stop": "END"}],
    "usage": {
        "prompt_tokens": 90,
        "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 64},
        "reasoning_tokens": 5,
    },
}


def test_sglangs_matched_stop_and_reasoning_tokens_reach_the_anthropic_stream() -> None:
    conv = AnthropicStream(model="m", stop_sequences=["END"])
    raw = conv.start() + conv.feed(_chunk({"content": "Hi"})) + conv.feed(SGLANG_END)
    events = json.loads(_without_ids(raw + conv.finish()))
    (delta,) = [e for e in events if e["type"] == "message_delta"]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert delta["usage"]["cache_read_input_tokens"] == 64
    assert delta["usage"]["input_tokens"] == 26
    assert conv.usage.reasoning_tokens == 5


def test_sglangs_matched_stop_in_a_whole_answer() -> None:
    from prefixgate.apis.messages.response import openai_to_anthropic

    whole = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi"},
                "finish_reason": "stop",
                "matched_stop": "END",
            }
        ],
        "usage": SGLANG_END["usage"],
    }
    msg, usage = openai_to_anthropic(whole, model="m", stop_sequences=["END"])
    assert (msg["stop_reason"], msg["stop_sequence"]) == ("stop_sequence", "END")
    # an end token's id (SGLang's matched_stop for an EOS) is an ordinary end of turn
    whole["choices"][0]["matched_stop"] = 2
    msg, _ = openai_to_anthropic(whole, model="m", stop_sequences=["END"])
    assert (msg["stop_reason"], msg["stop_sequence"]) == ("end_turn", None)
    assert usage.reasoning_tokens == 5
