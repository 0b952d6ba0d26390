"""The SSE decoder and the OpenAI Chat / Anthropic / OpenAI Responses stream parsers on
hand-made streams, and the request bodies."""

from __future__ import annotations

import json

import pytest

from prefixgate.lab.bench.client import (
    AnthropicStreamParser,
    OpenAIStreamParser,
    ResponsesStreamParser,
    SSEDecoder,
    anthropic_body,
    openai_body,
    responses_body,
)
from prefixgate.lab.bench.specs import RequestResult, RequestSpec, Target


def chunk(delta=None, usage=None, finish=None):
    body = {"id": "c", "object": "chat.completion.chunk", "choices": []}
    if delta is not None:
        body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    if usage is not None:
        body["usage"] = usage
    return json.dumps(body)


def feed_all(parser, events):
    for ts, event, data in events:
        parser.feed(event, data, ts)
    return parser.finish()


def test_openai_stream_timeline():
    r = RequestResult(start=10.0)
    events = [
        (10.100, None, chunk({"role": "assistant", "content": ""})),  # role-only: TTFT
        (10.150, None, chunk({"reasoning_content": "think"})),
        (10.170, None, chunk({"content": "Hel"})),  # first visible
        (10.200, None, chunk({"content": "lo"}, finish="length")),
        (
            10.201,
            None,
            chunk(
                usage={
                    "prompt_tokens": 120,
                    "completion_tokens": 4,
                    "prompt_tokens_details": {"cached_tokens": 96},
                }
            ),
        ),
        (10.300, None, "[DONE]"),
    ]
    out = feed_all(OpenAIStreamParser(r), events)
    assert out.success and out.error == ""
    assert out.ttft == pytest.approx(0.100)
    assert out.ttft_visible == pytest.approx(0.170)
    assert out.itl == pytest.approx([0.050, 0.020, 0.030])
    assert out.latency == pytest.approx(0.201)  # the usage chunk is the last event; not [DONE]
    assert (out.input_tokens, out.output_tokens, out.cached_tokens) == (120, 4, 96)
    assert out.text == "Hello"
    assert out.reasoning_chars == 5
    assert out.finish_reason == "length"
    assert out.tpot() == pytest.approx((0.201 - 0.100) / 3)


def test_openai_reasoning_field_and_missing_usage():
    r = RequestResult(start=0.0)
    out = feed_all(
        OpenAIStreamParser(r),
        [(0.5, None, chunk({"reasoning": "hm"})), (0.6, None, chunk({"content": "x"}))],
    )
    assert out.success and not out.usage_seen
    assert out.reasoning_chars == 2
    assert out.output_tokens == 2  # chunk count as a flagged lower bound


def test_openai_error_in_stream_fails_the_request():
    r = RequestResult(start=0.0)
    out = feed_all(
        OpenAIStreamParser(r),
        [
            (0.1, None, chunk({"content": "a"})),
            (0.2, None, json.dumps({"error": {"message": "engine died"}})),
        ],
    )
    assert not out.success and "engine died" in out.error


def test_openai_stream_without_output_fails():
    out = feed_all(OpenAIStreamParser(RequestResult()), [(0.1, None, "[DONE]")])
    assert not out.success and "without output" in out.error


def a_event(kind, **body):
    return kind, json.dumps({"type": kind, **body})


def test_anthropic_stream_timeline():
    r = RequestResult(start=1.0)
    seq = [
        (1.010, *a_event("message_start", message={"usage": {"input_tokens": 0, "output_tokens": 0}})),
        (1.011, *a_event("ping")),
        (1.020, *a_event("content_block_start", index=0, content_block={"type": "thinking"})),
        (1.100, *a_event("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "abc"})),
        (1.130, *a_event("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "s"})),
        (1.131, *a_event("content_block_stop", index=0)),
        (1.132, *a_event("content_block_start", index=1, content_block={"type": "text"})),
        (1.150, *a_event("content_block_delta", index=1, delta={"type": "text_delta", "text": "Hi"})),
        (1.200, *a_event("content_block_delta", index=1, delta={"type": "text_delta", "text": "!"})),
        (1.201, *a_event("content_block_stop", index=1)),
        (
            1.210,
            *a_event(
                "message_delta",
                delta={"stop_reason": "max_tokens"},
                usage={"input_tokens": 20, "cache_read_input_tokens": 80, "cache_creation_input_tokens": 4, "output_tokens": 7},
            ),
        ),
        (1.220, *a_event("message_stop")),
    ]  # fmt: skip
    out = feed_all(AnthropicStreamParser(r), seq)
    assert out.success
    assert out.ttft == pytest.approx(0.100)  # first content_block_delta
    assert out.ttft_visible == pytest.approx(0.150)  # first text_delta
    # gaps between deltas, each measured from the event before it
    assert out.itl == pytest.approx([0.030, 0.018, 0.050])
    assert out.latency == pytest.approx(0.220)
    assert (out.input_tokens, out.cached_tokens, out.output_tokens) == (104, 80, 7)
    assert out.usage_seen
    assert out.text == "Hi!"
    assert out.finish_reason == "max_tokens"


def test_anthropic_error_event():
    r = RequestResult(start=0.0)
    out = feed_all(
        AnthropicStreamParser(r),
        [
            (0.1, *a_event("message_start", message={"usage": {}})),
            (0.2, *a_event("error", error={"type": "overloaded_error", "message": "busy"})),
        ],
    )
    assert not out.success and "overloaded_error" in out.error and "busy" in out.error


def r_event(kind: str, **data) -> tuple[str, str]:
    return kind, json.dumps({"type": kind, **data})


def test_responses_stream_timeline():
    r = RequestResult(start=1.0)
    usage = {
        "input_tokens": 104,
        "input_tokens_details": {"cached_tokens": 80},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 3},
    }
    seq = [
        (1.010, *r_event("response.created", response={"usage": None})),
        (1.011, *r_event("response.output_item.added", item={"type": "reasoning"})),
        (1.100, *r_event("response.reasoning_text.delta", delta="abc")),
        (1.131, *r_event("response.output_item.done", item={"type": "reasoning"})),
        (1.150, *r_event("response.output_text.delta", delta="Hi")),
        (1.200, *r_event("response.output_text.delta", delta="!")),
        (1.205, *r_event("response.function_call_arguments.delta", delta="{}")),
        (
            1.220,
            *r_event(
                "response.incomplete",
                response={"usage": usage, "incomplete_details": {"reason": "max_output_tokens"}},
            ),
        ),
    ]
    out = feed_all(ResponsesStreamParser(r), seq)
    assert out.success
    assert out.ttft == pytest.approx(0.100)  # the first delta, reasoning included
    assert out.ttft_visible == pytest.approx(0.150)  # the first text delta
    assert out.itl == pytest.approx([0.019, 0.050, 0.005])
    assert out.latency == pytest.approx(0.220)
    # input_tokens includes the cached part already (OpenAI semantics)
    assert (out.input_tokens, out.cached_tokens, out.output_tokens) == (104, 80, 7)
    assert out.usage_seen and out.text == "Hi!" and out.reasoning_chars == 3
    assert out.finish_reason == "length"


def test_responses_failed_event():
    out = feed_all(
        ResponsesStreamParser(RequestResult(start=0.0)),
        [
            (0.1, *r_event("response.created", response={})),
            (
                0.2,
                *r_event(
                    "response.failed",
                    response={"error": {"code": "server_error", "message": "boom"}},
                ),
            ),
        ],
    )
    assert not out.success and "server_error" in out.error and "boom" in out.error


def test_sse_decoder_events_comments_and_multiline():
    dec = SSEDecoder()
    lines = [
        ": keep-alive",
        "event: message_delta",
        'data: {"a":',
        "data: 1}",
        "",
        "",
        "data: x",
        "",
    ]
    events = [e for line in lines if (e := dec.feed(line)) is not None]
    assert events == [("message_delta", '{"a":\n1}'), (None, "x")]
    assert dec.flush() is None


def test_bodies():
    spec = RequestSpec(
        ({"role": "system", "content": "S"}, {"role": "user", "content": "U"}),
        256,
        thinking=True,
    )
    o = openai_body(spec, "m")
    assert o["ignore_eos"] is True and o["temperature"] == 0 and o["stream"] is True
    assert o["stream_options"] == {"include_usage": True}
    assert o["chat_template_kwargs"] == {"enable_thinking": True}
    assert o["messages"][0] == {"role": "system", "content": "S"}
    a = anthropic_body(spec, "m")
    assert "ignore_eos" not in a and a["system"] == "S"
    assert a["messages"] == [{"role": "user", "content": "U"}]
    assert a["thinking"]["type"] == "enabled" and 0 < a["thinking"]["budget_tokens"] < 256
    off = anthropic_body(RequestSpec(spec.messages, 16), "m")
    assert off["thinking"] == {"type": "disabled"}
    assert openai_body(RequestSpec(spec.messages, 16), "m")["chat_template_kwargs"] == {
        "enable_thinking": False
    }
    resp = responses_body(spec, "m")
    assert "ignore_eos" not in resp and resp["instructions"] == "S"
    assert resp["input"] == [{"role": "user", "content": "U"}]
    assert resp["max_output_tokens"] == 256 and resp["store"] is False and resp["stream"]
    assert resp["reasoning"] == {"effort": "medium"}
    assert responses_body(RequestSpec(spec.messages, 16), "m")["reasoning"] == {"effort": "none"}


def test_target_urls():
    t = Target("v", "http://h:8000/v1")
    assert t.endpoint() == "http://h:8000/v1/chat/completions"
    assert t.scrape_url() == "http://h:8000/metrics"
    assert t.models_url() == "http://h:8000/v1/models"
    g = Target("g", "http://h:8787", api="anthropic")
    assert g.endpoint() == "http://h:8787/v1/messages"
    assert (
        Target("g", "http://h:8787/v1", api="anthropic").endpoint() == "http://h:8787/v1/messages"
    )
    assert g.scrape_url() == "http://h:8787/metrics"
    assert Target("r", "http://h:8787/v1", api="responses").endpoint() == (
        "http://h:8787/v1/responses"
    )
    assert Target("r", "http://h:8787", api="responses").endpoint() == (
        "http://h:8787/v1/responses"
    )
    assert Target("x", "http://h/v1", metrics_url="").scrape_url() is None
