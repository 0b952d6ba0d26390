"""The official SDKs as clients, over HTTP on loopback, against a scripted upstream."""

from __future__ import annotations

import asyncio
import json

import anthropic
import openai
import pytest

from tests.fakes import Reply

_OPEN: list = []  # the clients a test made, closed when it ends


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _OPEN:
        _OPEN.pop().close()


def a_client(gw, **kw) -> anthropic.Anthropic:
    client = anthropic.Anthropic(base_url=gw.url, api_key="test-key", max_retries=0, **kw)
    _OPEN.append(client)
    return client


def o_client(gw, **kw) -> openai.OpenAI:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="test-key", max_retries=0, **kw)
    _OPEN.append(client)
    return client


def test_messages_non_streaming_text_and_usage(gateway, upstream):
    gw = gateway()
    upstream.script = lambda b: Reply(
        text="Hi there", prompt_tokens=1000, cached_tokens=768, completion_tokens=5
    )
    msg = a_client(gw).messages.create(
        model="m",
        max_tokens=50,
        system="Be brief.",
        messages=[{"role": "user", "content": "hello"}],
    )
    assert msg.content[0].type == "text" and msg.content[0].text == "Hi there"
    assert msg.stop_reason == "end_turn"
    # Anthropic semantics: input_tokens excludes the cached part.
    assert msg.usage.input_tokens == 232
    assert msg.usage.cache_read_input_tokens == 768
    assert msg.usage.output_tokens == 5
    sent = upstream.requests[-1]
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
    ]
    assert sent["max_tokens"] == 50
    rec = gw.records[-1]
    assert (rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens) == (1000, 768, 5)
    assert rec.reported_input_tokens == 232 and rec.status == 200 and rec.endpoint == "messages"


def test_messages_streaming_thinking_text_tool(gateway, upstream):
    gw = gateway()
    upstream.script = lambda b: Reply(
        reasoning="Let me think about it.",
        text="I will read the file.",
        tool_calls=[{"id": "call_1", "name": "Read", "arguments": '{"path": "/tmp/x"}'}],
        finish_reason="tool_calls",
        prompt_tokens=500,
        cached_tokens=448,
        completion_tokens=30,
    )
    client = a_client(gw)
    with client.messages.stream(
        model="m",
        max_tokens=100,
        messages=[{"role": "user", "content": "read /tmp/x"}],
        tools=[
            {
                "name": "Read",
                "description": "read",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
            }
        ],
        thinking={"type": "enabled", "budget_tokens": 2000},
    ) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start"
    kinds = [b.type for b in final.content]
    assert kinds == ["thinking", "text", "tool_use"]
    assert final.content[0].thinking == "Let me think about it."
    assert final.content[1].text == "I will read the file."
    assert final.content[2].name == "Read" and final.content[2].input == {"path": "/tmp/x"}
    assert final.content[2].id == "call_1"
    assert final.stop_reason == "tool_use"
    assert final.usage.input_tokens == 52 and final.usage.cache_read_input_tokens == 448
    assert final.usage.output_tokens == 30
    sent = upstream.requests[-1]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["chat_template_kwargs"] == {"enable_thinking": True}
    assert sent["tools"][0]["function"]["name"] == "Read"


def test_message_start_carries_no_inflated_usage(gateway, upstream):
    gw = gateway()
    upstream.script = lambda b: Reply(text="x", prompt_tokens=90000, cached_tokens=89000)
    client = a_client(gw)
    with client.messages.stream(
        model="m", max_tokens=10, messages=[{"role": "user", "content": "q"}]
    ) as stream:
        start = next(iter(stream))
        assert start.type == "message_start"
        assert start.message.usage.input_tokens == 0
        final = stream.get_final_message()
    assert final.usage.input_tokens == 1000 and final.usage.cache_read_input_tokens == 89000


def test_tool_use_round_trip(gateway, upstream):
    gw = gateway()
    upstream.script = lambda b: Reply(
        tool_calls=[{"id": "call_9", "name": "get_weather", "arguments": '{"city":"Paris"}'}],
        finish_reason="tool_calls",
    )
    client = a_client(gw)
    tools = [
        {
            "name": "get_weather",
            "description": "Weather",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    first = client.messages.create(
        model="m", max_tokens=64, tools=tools, messages=[{"role": "user", "content": "weather?"}]
    )
    assert first.stop_reason == "tool_use"
    call = first.content[0]
    upstream.script = lambda b: Reply(text="It is sunny.")
    second = client.messages.create(
        model="m",
        max_tokens=64,
        tools=tools,
        messages=[
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in first.content],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21C"}
                ],
            },
        ],
    )
    assert second.content[0].text == "It is sunny."
    sent = upstream.requests[-1]["messages"]
    assert sent[1]["tool_calls"][0]["id"] == "call_9"
    assert json.loads(sent[1]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert sent[2] == {"role": "tool", "tool_call_id": "call_9", "content": "sunny, 21C"}


def test_async_anthropic_streaming(gateway, upstream):
    gw = gateway()
    upstream.script = lambda b: Reply(text="async works", chunk_delay=0.01)

    async def run():
        client = anthropic.AsyncAnthropic(base_url=gw.url, api_key="k", max_retries=0)
        async with client.messages.stream(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "q"}]
        ) as s:
            text = "".join([t async for t in s.text_stream])
        await client.close()
        return text

    assert asyncio.run(run()) == "async works"


def test_chat_passthrough_non_streaming_and_model_map(gateway, upstream):
    gw = gateway({"models": ["llm-prime"], "model_map": {"llm-prime": "deepseek-v4-flash-0731"}})
    upstream.script = lambda b: Reply(text="pong", prompt_tokens=20, cached_tokens=16)
    resp = o_client(gw).chat.completions.create(
        model="llm-prime", messages=[{"role": "user", "content": "ping"}]
    )
    assert resp.choices[0].message.content == "pong"
    assert resp.model == "llm-prime"
    assert upstream.requests[-1]["model"] == "deepseek-v4-flash-0731"
    assert resp.usage.prompt_tokens_details.cached_tokens == 16
    rec = gw.records[-1]
    assert rec.upstream_model == "deepseek-v4-flash-0731" and rec.requested_model == "llm-prime"


def test_chat_stream_usage_hidden_unless_asked(gateway, upstream):
    gw = gateway()
    upstream.script = lambda b: Reply(
        text="a b c", prompt_tokens=64, cached_tokens=32, completion_tokens=3
    )
    client = o_client(gw)
    chunks = list(
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True
        )
    )
    assert all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "a b c"
    # The gateway still asked for usage upstream and recorded it.
    assert upstream.requests[-1]["stream_options"] == {"include_usage": True}
    assert gw.records[-1].cached_tokens == 32 and gw.records[-1].prompt_tokens == 64
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "x"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.prompt_tokens == 64


def test_async_openai_stream(gateway, upstream):
    gw = gateway()
    upstream.script = lambda b: Reply(text="one two")

    async def run():
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        await client.close()
        return text

    assert asyncio.run(run()) == "one two"


def test_models_listing_both_shapes(gateway):
    gw = gateway({"models": ["a"], "model_map": {"b": "up-b"}})
    ids = [m.id for m in o_client(gw).models.list()]
    assert ids == ["a", "b"]
    ids = [m.id for m in a_client(gw).models.list()]
    assert ids == ["a", "b"]


def test_models_of_a_channel_that_serves_any_model_come_from_its_upstream(
    gateway, upstream, monkeypatch
):
    monkeypatch.setenv("UP_KEY", "sk-upstream-models-0123456789")
    gw = gateway({"api_key_env": "UP_KEY", "model_map": {"alias": "up-1"}})
    upstream.model_ids = ["up-1", "up-2"]
    assert [m.id for m in o_client(gw).models.list()] == ["alias", "up-1", "up-2"]
    assert [m.id for m in a_client(gw).models.list()] == ["alias", "up-1", "up-2"]
    assert upstream.model_listings == 1  # kept for a minute
    assert upstream.headers[-1]["authorization"] == "Bearer sk-upstream-models-0123456789"


def test_models_listing_survives_an_upstream_without_one(gateway, upstream):
    gw = gateway()
    upstream.model_ids = None  # 404
    assert [m.id for m in o_client(gw).models.list()] == []
    assert upstream.model_listings == 1


def test_count_tokens(gateway):
    gw = gateway()
    n = a_client(gw).messages.count_tokens(
        model="m", messages=[{"role": "user", "content": "hello " * 400}]
    )
    assert 400 <= n.input_tokens <= 1000


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequence(gateway, upstream, stream):
    gw = gateway()
    upstream.script = lambda b: Reply(text="one two", stop_reason="END")
    client = a_client(gw)
    args = dict(
        model="m",
        max_tokens=10,
        stop_sequences=["END"],
        messages=[{"role": "user", "content": "q"}],
    )
    if stream:
        with client.messages.stream(**args) as s:
            msg = s.get_final_message()
    else:
        msg = client.messages.create(**args)
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "END"
    assert upstream.requests[-1]["stop"] == ["END"]
