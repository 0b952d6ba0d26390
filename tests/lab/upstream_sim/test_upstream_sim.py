from __future__ import annotations

import asyncio
import json
import random
import re
import time

import httpx
import openai
import pytest

from prefixgate.cache import (
    ApproxTokenizer,
    ChatRenderer,
    JinjaChatTemplate,
    render_tokens,
)
from prefixgate.lab.upstream_sim import (
    SimSettings,
    running_upstreams,
    serve_upstreams,
    settings_from_options,
    start_embedded,
    start_upstreams_in_thread,
)
from prefixgate.lab.upstream_sim.textgen import cut_at_stop, schema_value, tool_arguments

B = 16
SYSTEM = "You are a careful assistant. Answer briefly and cite the files you read. " * 6
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 3},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "detail": {"type": "boolean"},
                "where": {
                    "type": "object",
                    "properties": {
                        "lat": {"type": "number", "minimum": -90, "maximum": 90},
                        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                    },
                    "required": ["lat", "tags"],
                },
                "optional_note": {"type": "string"},
            },
            "required": ["city", "unit", "days", "detail", "where"],
        },
    },
}
READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "ranges": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"start": {"type": "integer"}, "end": {"type": "integer"}},
                        "required": ["start", "end"],
                    },
                },
            },
            "required": ["path", "ranges"],
        },
    },
}
TOOLS = [WEATHER, READ_FILE]


def validate(value, schema: dict, path: str = "$") -> None:
    """A tiny JSON-schema check for the features the test schemas use."""
    if "enum" in schema:
        assert value in schema["enum"], path
    kind = schema.get("type")
    if kind == "object":
        assert isinstance(value, dict), path
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            assert name in value, f"{path}.{name} missing"
        for name, sub in value.items():
            assert name in props, f"{path}.{name} unexpected"
            validate(sub, props[name], f"{path}.{name}")
    elif kind == "array":
        assert isinstance(value, list), path
        assert len(value) >= schema.get("minItems", 0), path
        for i, item in enumerate(value):
            validate(item, schema.get("items", {}), f"{path}[{i}]")
    elif kind == "string":
        assert isinstance(value, str), path
        assert len(value) >= schema.get("minLength", 0), path
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), path
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value), path
    elif kind == "number":
        assert isinstance(value, int | float) and not isinstance(value, bool), path
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value), path
    elif kind == "boolean":
        assert isinstance(value, bool), path


def prompt_tokens(messages, tools=None, order="tools_first") -> list[int]:
    return render_tokens(ChatRenderer(order), ApproxTokenizer(), messages, tools)


def convo(user: str = "What is in the README?", system: str = SYSTEM) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def metric(text: str, name: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        m = re.fullmatch(r"([^{ ]+)(?:\{(.*)\})? (\S+)", line)
        assert m, line
        if m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


@pytest.fixture
def sim():
    """``sim(**settings)`` → (server, OpenAI client); everything is closed afterwards."""
    opened = []

    def start(**kw):
        (srv,) = start_upstreams_in_thread(SimSettings(**kw))
        client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)
        opened.append((srv, client))
        return srv, client

    yield start
    for srv, client in opened:
        client.close()
        srv.stop()


# -- text ------------------------------------------------------------------------------------


def test_non_streaming_text_is_deterministic(sim):
    srv, client = sim()
    r1 = client.chat.completions.create(model="any-name", messages=convo())
    r2 = client.chat.completions.create(model="any-name", messages=convo())
    assert r1.id.startswith("chatcmpl-") and r1.object == "chat.completion"
    assert r1.model == "any-name"
    choice = r1.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] is None
    assert r1.usage.completion_tokens == 32
    assert r1.usage.prompt_tokens == len(prompt_tokens(convo()))
    assert r1.usage.total_tokens == r1.usage.prompt_tokens + 32
    assert r2.choices[0].message.content == choice.message.content
    other = client.chat.completions.create(model="m", messages=convo("Something else"))
    assert other.choices[0].message.content != choice.message.content


def test_streaming_text_matches_non_streaming(sim):
    srv, client = sim()
    full = client.chat.completions.create(model="m", messages=convo())
    chunks = list(client.chat.completions.create(model="m", messages=convo(), stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    content = [c.choices[0].delta.content for c in chunks[1:]]
    assert len(content) > 3 and all(content)
    assert "".join(content) == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert all(c.usage is None and c.choices for c in chunks)


def test_stream_usage_only_with_include_usage(sim):
    srv, client = sim()
    client.chat.completions.create(model="m", messages=convo())  # warm the cache
    stream = client.chat.completions.create(
        model="m", messages=convo(), stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    L = len(prompt_tokens(convo()))
    assert last.usage.prompt_tokens == L
    assert last.usage.completion_tokens == 32
    assert last.usage.prompt_tokens_details.cached_tokens == (L - 1) // B * B
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == "stop"
    plain = list(
        client.chat.completions.create(
            model="m", messages=convo(), stream=True, stream_options={"include_usage": False}
        )
    )
    assert all(c.usage is None and c.choices for c in plain)


def test_raw_sse_framing(sim):
    srv, _ = sim()
    body = {"model": "m", "messages": convo(), "stream": True}
    with httpx.Client() as h:
        with h.stream("POST", srv.base_url + "/chat/completions", json=body) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            raw = resp.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    first = json.loads(events[0].removeprefix("data: "))
    assert first["choices"][0] == {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    last = json.loads(events[-3].removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] == "stop"
    assert last["choices"][0]["stop_reason"] is None


# -- the cache -------------------------------------------------------------------------------


def _pad_user(system: str, user: str) -> str:
    """Pad the user text so the rendered prompt ends mid-token and mid-block: then the
    next turn shares exactly the old prompt's full blocks (no partial-token edge case)."""
    while True:
        text = ChatRenderer().render(convo(user, system))
        n = len(prompt_tokens(convo(user, system)))
        if len(text) % 4 and n % B:
            return user
        user += "!"


def _nothing_hit(r, version: str) -> None:
    """vLLM 0.32 reports a 0; earlier releases leave the details out."""
    if version == "0.32":
        assert r.usage.prompt_tokens_details.cached_tokens == 0
    else:
        assert r.usage.prompt_tokens_details is None


@pytest.mark.parametrize("version", ["0.32", "0.10.1"])
def test_cached_tokens_follow_the_vllm_rule(sim, version):
    srv, client = sim(block_size=B, vllm_version=version)
    cache = srv.cache
    user = _pad_user(SYSTEM, "Summarise the design notes.")
    msgs = convo(user)
    tokens = prompt_tokens(msgs)
    L = len(tokens)

    assert cache.peek(tokens) == 0
    r = client.chat.completions.create(model="m", messages=msgs)
    assert r.usage.prompt_tokens == L
    _nothing_hit(r, version)

    assert cache.peek(tokens) == (L - 1) // B * B
    r = client.chat.completions.create(model="m", messages=msgs)
    assert r.usage.prompt_tokens_details.cached_tokens == (L - 1) // B * B

    longer = [
        *msgs,
        {"role": "assistant", "content": r.choices[0].message.content},
        {"role": "user", "content": "And the tests?"},
    ]
    new_tokens = prompt_tokens(longer)
    predicted = cache.peek(new_tokens)
    assert predicted == L // B * B  # exactly the old prompt's full blocks
    r = client.chat.completions.create(model="m", messages=longer)
    assert r.usage.prompt_tokens_details.cached_tokens == predicted
    assert r.usage.prompt_tokens == len(new_tokens)

    edited = convo(user, "W" + SYSTEM[1:])  # an edit at token 0
    assert cache.peek(prompt_tokens(edited)) == 0
    r = client.chat.completions.create(model="m", messages=edited)
    _nothing_hit(r, version)


def test_an_unknown_engine_version_is_refused():
    with pytest.raises(ValueError, match="vllm_version"):
        SimSettings(vllm_version="latest")


def test_cached_tokens_not_reported_when_disabled(sim):
    srv, client = sim(report_cached_tokens=False)
    for _ in range(2):
        r = client.chat.completions.create(model="m", messages=convo())
        assert r.usage.prompt_tokens_details is None
    assert srv.cache.hits > 0


def test_output_blocks_are_cached(sim):
    """end(lease, output_tokens) caches the blocks the answer completes."""
    srv, client = sim(block_size=4, default_output_tokens=40)
    msgs = convo("x")
    r = client.chat.completions.create(model="m", messages=msgs)
    L = r.usage.prompt_tokens
    assert srv.cache.pool.num_cached_blocks == (L + 40 - 1) // 4


def test_render_order_changes_the_prompt(sim):
    srv, client = sim(render_order="system_first")
    msgs = convo()
    r = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
    assert r.usage.prompt_tokens == len(prompt_tokens(msgs, TOOLS, "system_first"))
    assert srv.cache.peek(prompt_tokens(msgs, TOOLS, "system_first")) > 0
    assert srv.cache.peek(prompt_tokens(msgs, TOOLS, "tools_first")) == 0


def test_cache_salt_isolates_tenants(sim):
    srv, client = sim()
    msgs = convo()
    L = len(prompt_tokens(msgs))
    full = (L - 1) // B * B

    def cached(salt):
        extra = {"cache_salt": salt} if salt else None
        r = client.chat.completions.create(model="m", messages=msgs, extra_body=extra)
        d = r.usage.prompt_tokens_details
        return d.cached_tokens if d else 0

    assert cached("tenant-a") == 0
    assert cached("tenant-a") == full
    assert cached("tenant-b") == 0
    assert cached(None) == 0
    assert cached(None) == full
    assert srv.cache.peek(prompt_tokens(msgs), salt="tenant-b") == full


def test_replicas_have_independent_caches():
    with running_upstreams(SimSettings(), replicas=2) as (a, b):
        assert a.url != b.url and a.cache is not b.cache
        body = {"model": "m", "messages": convo()}
        with httpx.Client() as h:
            for _ in range(2):
                ra = h.post(a.base_url + "/chat/completions", json=body).json()
            rb = h.post(b.base_url + "/chat/completions", json=body).json()
        assert ra["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert rb["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        assert a.cache.requests == 2 and b.cache.requests == 1


# -- tools and thinking ------------------------------------------------------------------------


def test_tool_choice_required_and_named(sim):
    srv, client = sim()
    r = client.chat.completions.create(
        model="m", messages=convo(), tools=TOOLS, tool_choice="required"
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    assert r.usage.completion_tokens > 0

    r = client.chat.completions.create(
        model="m",
        messages=convo(),
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "read_file"}},
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "read_file"
    args = json.loads(call.function.arguments)
    validate(args, READ_FILE["function"]["parameters"])
    assert args["ranges"] and isinstance(args["ranges"][0]["start"], int)


def test_call_trigger_in_last_user_message(sim):
    srv, client = sim()
    msgs = convo("Please [[call:read_file]] and then [[call:get_weather]].")
    r = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["read_file", "get_weather"]
    assert len({c.id for c in calls}) == 2
    assert r.choices[0].finish_reason == "tool_calls"
    # an unknown tool name, tool_choice "none", an older message, or a message whose
    # calls were answered (a tool result follows it) does not trigger
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    answered = [
        *msgs,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "the file"},
    ]
    for kw, m in (
        ({"tools": TOOLS}, convo("[[call:nope]]")),
        ({"tools": TOOLS, "tool_choice": "none"}, msgs),
        (
            {"tools": TOOLS},
            [*msgs, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "thanks"}],
        ),
        ({"tools": TOOLS}, answered),
    ):
        r = client.chat.completions.create(model="m", messages=m, **kw)
        assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason == "stop"


def test_streaming_tool_calls_reassembled_by_the_sdk(sim):
    srv, client = sim()
    kwargs = {"model": "m", "messages": convo(), "tools": TOOLS, "tool_choice": "required"}
    plain = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    head = chunks[1].choices[0].delta.tool_calls[0]
    assert head.index == 0 and head.id and head.type == "function"
    assert head.function.name == "get_weather"
    frags = [c.choices[0].delta.tool_calls[0].function.arguments for c in chunks[2:]]
    assert len(frags) > 2 and all(c.choices[0].delta.tool_calls[0].id is None for c in chunks[2:])
    with client.chat.completions.stream(**kwargs) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls"
    assert call.function.arguments == plain.choices[0].message.tool_calls[0].function.arguments
    validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_thinking_emits_reasoning_content(sim):
    srv, client = sim()
    extra = {"chat_template_kwargs": {"enable_thinking": True}}
    r = client.chat.completions.create(model="m", messages=convo(), extra_body=extra)
    msg = r.choices[0].message
    assert msg.model_extra["reasoning_content"] and msg.content
    assert r.usage.completion_tokens == 32
    r = client.chat.completions.create(model="m", messages=convo())
    assert r.choices[0].message.model_extra["reasoning_content"] is None
    chunks = list(
        client.chat.completions.create(
            model="m", messages=convo(), stream=True, reasoning_effort="low"
        )
    )
    kinds = [
        "r" if (c.choices[0].delta.model_extra or {}).get("reasoning_content") else "c"
        for c in chunks[1:]
    ]
    assert kinds[0] == "r" and kinds[-1] == "c"
    assert kinds == sorted(kinds, reverse=True)  # all reasoning before any content


# -- output length and stops --------------------------------------------------------------------


def test_max_tokens_and_ignore_eos(sim):
    srv, client = sim(default_output_tokens=32)
    r = client.chat.completions.create(model="m", messages=convo(), max_tokens=5)
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    r = client.chat.completions.create(model="m", messages=convo(), max_tokens=100)
    assert r.usage.completion_tokens == 32 and r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(
        model="m", messages=convo(), max_tokens=100, extra_body={"ignore_eos": True}
    )
    assert r.usage.completion_tokens == 100 and r.choices[0].finish_reason == "length"
    stream = client.chat.completions.create(
        model="m",
        messages=convo(),
        max_completion_tokens=77,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 77


def test_stop_strings(sim):
    srv, client = sim()
    text = client.chat.completions.create(model="m", messages=convo()).choices[0].message.content
    stop = text[60:66]
    at = text.find(stop)
    r = client.chat.completions.create(model="m", messages=convo(), stop=["zzzz-never", stop])
    choice = r.choices[0]
    assert choice.message.content == text[:at]
    assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] == stop
    assert r.usage.completion_tokens < 32
    chunks = list(
        client.chat.completions.create(model="m", messages=convo(), stop=stop, stream=True)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text[:at]
    assert chunks[-1].choices[0].model_extra["stop_reason"] == stop


def test_cut_at_stop_counts_tokens():
    pieces = ["Hell", "o wo", "rld ", "agai", "n"]
    assert cut_at_stop(pieces, ["wor"]) == (["Hell", "o ", ""], "wor")
    assert cut_at_stop(pieces, ["wor"], include_stop=True) == (["Hell", "o wo", "r"], "wor")
    assert cut_at_stop(pieces, ["xyz"]) == (pieces, None)
    assert cut_at_stop(pieces, ["again", "ld"])[1] == "ld"


# -- errors --------------------------------------------------------------------------------------


def test_context_length_errors(sim):
    srv, client = sim(max_model_len=300)
    long_msgs = convo("word " * 400)
    n = len(prompt_tokens(long_msgs))
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="m", messages=long_msgs)
    assert exc.value.status_code == 400
    assert exc.value.body["message"] == (
        f"This model's maximum context length is 300 tokens. However, your request has {n} "
        "input tokens. Please reduce the length of the input messages."
    )
    msgs = convo()
    n = len(prompt_tokens(msgs))
    assert n < 300
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="m", messages=msgs, max_tokens=290)
    assert exc.value.body["message"] == (
        f"'max_tokens' or 'max_completion_tokens' is too large: 290. This model's maximum "
        f"context length is 300 tokens and your request has {n} input tokens "
        f"(290 > 300 - {n})."
    )
    assert srv.cache.requests == 0  # refused before scheduling


def test_error_shapes(sim):
    srv, client = sim(accept_any_model=False, models=("served",))
    with httpx.Client() as h:
        r = h.post(srv.base_url + "/chat/completions", content=b"{not json")
        assert r.status_code == 400
        body = r.json()
        assert body["object"] == "error" and body["type"] == "BadRequestError"
        assert body["code"] == 400 and body["param"] is None and body["message"]
        r = h.post(srv.base_url + "/chat/completions", json={"model": "served"})
        assert r.status_code == 400 and "messages" in r.json()["message"]
        r = h.post(
            srv.base_url + "/chat/completions",
            json={"model": "served", "messages": convo(), "tool_choice": "required"},
        )
        assert r.status_code == 400
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="other", messages=convo())
    assert exc.value.body["message"] == "The model `other` does not exist."
    assert client.chat.completions.create(model="served", messages=convo()).model == "served"


def test_nested_error_shape(sim):
    srv, client = sim(max_model_len=50, nested_errors=True)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="m", messages=convo())
    assert "maximum context length is 50 tokens" in exc.value.body["message"]
    assert exc.value.body["type"] == "BadRequestError"


# -- other routes ---------------------------------------------------------------------------------


def test_models_health_tokenize(sim):
    srv, client = sim(models=("a", "b"), max_model_len=4096)
    models = client.models.list()
    assert [m.id for m in models.data] == ["a", "b"]
    assert models.data[0].model_extra["max_model_len"] == 4096
    assert models.data[0].owned_by == "vllm"
    with httpx.Client(base_url=srv.url) as h:
        r = h.get("/health")
        assert r.status_code == 200 and r.content == b""
        msgs = convo()
        tok = h.post("/tokenize", json={"model": "a", "messages": msgs, "tools": TOOLS}).json()
        assert tok["tokens"] == prompt_tokens(msgs, TOOLS)
        assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 4096
        usage = client.chat.completions.create(model="a", messages=msgs, tools=TOOLS).usage
        assert usage.prompt_tokens == tok["count"]
        tok = h.post("/tokenize", json={"model": "a", "prompt": "hello world!"}).json()
        assert tok["count"] == 3
        text = h.post("/detokenize", json={"model": "a", "tokens": tok["tokens"]}).json()
        assert text == {"prompt": "hello world!"}
        assert h.post("/tokenize", json={"model": "a"}).status_code == 400


def test_jinja_chat_template(sim, tmp_path):
    path = tmp_path / "template.jinja"
    path.write_text(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}"
        "{% if enable_thinking %}<think>{% endif %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    srv, client = sim(chat_template=str(path))
    msgs = convo()
    text = JinjaChatTemplate.from_file(path).render(msgs)
    r = client.chat.completions.create(model="m", messages=msgs)
    assert r.usage.prompt_tokens == ApproxTokenizer().count(text)
    extra = {"chat_template_kwargs": {"enable_thinking": True}}
    r = client.chat.completions.create(model="m", messages=msgs, extra_body=extra)
    text = JinjaChatTemplate.from_file(path).render(msgs, enable_thinking=True)
    assert r.usage.prompt_tokens == ApproxTokenizer().count(text)


def test_metrics_count_tokens(sim):
    srv, client = sim()
    with httpx.Client(base_url=srv.url) as h:
        before = h.get("/metrics").text
        client.chat.completions.create(model="m", messages=convo())
        r = client.chat.completions.create(model="m", messages=convo(), max_tokens=4)
        after = h.get("/metrics").text
    L = r.usage.prompt_tokens
    hit = r.usage.prompt_tokens_details.cached_tokens

    def delta(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("vllm:prompt_tokens_total") == 2 * L
    assert delta("vllm:prefix_cache_queries_total") == 2 * L
    assert delta("vllm:prefix_cache_hits_total") == hit
    assert delta("vllm:prompt_tokens_cached_total") == hit
    assert delta("vllm:prompt_tokens_by_source_total", source="local_cache_hit") == hit
    assert delta("vllm:prompt_tokens_by_source_total", source="local_compute") == 2 * L - hit
    assert delta("vllm:generation_tokens_total") == 32 + 4
    assert delta("vllm:request_success_total", finished_reason="stop") == 1
    assert delta("vllm:request_success_total", finished_reason="length") == 1
    assert delta("vllm:time_to_first_token_seconds_count") == 2
    assert metric(after, "vllm:num_requests_running") == 0
    assert metric(after, "vllm:kv_cache_usage_perc") == 0
    assert (
        metric(after, "vllm:cache_config_info", block_size="16", enable_prefix_caching="True") == 1
    )
    assert 'model_name="sim-model"' in after


def test_kv_usage_with_capacity(sim):
    srv, client = sim(capacity_tokens=64 * B, decode_tokens_per_s=200, default_output_tokens=400)
    with client.chat.completions.create(model="m", messages=convo(), stream=True) as stream:
        next(iter(stream))
        assert srv.cache.usage > 0
        with httpx.Client() as h:
            text = h.get(srv.url + "/metrics").text
        assert metric(text, "vllm:kv_cache_usage_perc") > 0
        assert metric(text, "vllm:num_requests_running") == 1
        assert metric(text, "vllm:cache_config_info", num_gpu_blocks="64") == 1


def test_client_disconnect_releases_the_lease(sim):
    srv, client = sim(decode_tokens_per_s=50, default_output_tokens=200)
    stream = client.chat.completions.create(model="m", messages=convo(), stream=True)
    it = iter(stream)
    next(it)
    next(it)
    stream.close()
    deadline = time.monotonic() + 10
    while srv.cache.pool.num_used_blocks and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.cache.pool.num_used_blocks == 0
    assert srv.app.state.sim.metrics.finished["abort"] == 1
    assert srv.app.state.sim.metrics.running == 0
    # the prompt stays cached after an aborted request
    L = len(prompt_tokens(convo()))
    assert srv.cache.peek(prompt_tokens(convo())) == (L - 1) // B * B


def test_prefill_rate_makes_cold_prompts_slow(sim):
    # ~2000 prompt tokens at 4000 tokens/s: a cold prefill takes ~0.5 s, a warm one ~4 ms
    srv, client = sim(prefill_tokens_per_s=4000)
    msgs = convo("Read this file:\n" + "lorem ipsum dolor sit amet " * 290)
    L = len(prompt_tokens(msgs))
    assert 1800 < L < 2200

    def timed():
        t = time.perf_counter()
        client.chat.completions.create(model="m", messages=msgs, max_tokens=1)
        return time.perf_counter() - t

    cold, warm = timed(), timed()
    assert cold >= 0.4
    assert cold >= 2 * warm


# -- schema values, settings, serving -------------------------------------------------------------


def test_schema_value_handles_refs_unions_and_bounds():
    schema = {
        "type": "object",
        "$defs": {
            "pt": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
        },
        "properties": {
            "p": {"$ref": "#/$defs/pt"},
            "maybe": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 4}]},
            "kind": {"const": "fixed"},
            "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "n": {"type": ["integer", "null"], "minimum": 10},
            "both": {"allOf": [{"properties": {"a": {"type": "boolean"}}, "required": ["a"]}]},
            "tup": {"type": "array", "items": {"enum": [1, 2]}, "minItems": 3, "maxItems": 3},
        },
        "required": ["p", "maybe", "kind", "ratio", "n", "both", "tup"],
    }
    for seed in range(20):
        v = schema_value(schema, random.Random(seed))
        assert isinstance(v["p"]["x"], int)
        assert isinstance(v["maybe"], str) and len(v["maybe"]) <= 4
        assert v["kind"] == "fixed"
        assert 0 < v["ratio"] <= 1
        assert isinstance(v["n"], int) and v["n"] >= 10
        assert isinstance(v["both"]["a"], bool)
        assert len(v["tup"]) == 3 and set(v["tup"]) <= {1, 2}
    assert schema_value(schema, random.Random(1)) == schema_value(schema, random.Random(1))
    assert tool_arguments({"type": "function", "function": {"name": "x"}}, random.Random(0)) == {}


def test_settings_from_options():
    s = settings_from_options(
        port=9000,
        replicas=3,
        block_size=64,
        capacity_tokens=None,
        prefill_rate=1000.0,
        decode_rate=50.0,
        render_order="system_first",
        model="a,b",
        max_model_len=8192,
    )
    assert s.block_size == 64 and s.capacity_tokens is None
    assert s.prefill_tokens_per_s == 1000.0 and s.decode_tokens_per_s == 50.0
    assert s.models == ("a", "b") and s.max_model_len == 8192
    with pytest.raises(TypeError):
        settings_from_options(bogus=1)
    with pytest.raises(ValueError):
        SimSettings(render_order="random")


def test_serve_upstreams_in_the_event_loop():
    async def main():
        urls: list[str] = []
        task = asyncio.create_task(
            serve_upstreams(SimSettings(), port=0, replicas=2, ready=urls.extend)
        )
        while len(urls) < 2:
            assert not task.done()
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient() as h:
            body = {"model": "m", "messages": convo()}
            for _ in range(2):
                r0 = (await h.post(urls[0] + "/v1/chat/completions", json=body)).json()
            r1 = (await h.post(urls[1] + "/v1/chat/completions", json=body)).json()
            assert (await h.get(urls[1] + "/health")).status_code == 200
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return urls, r0, r1

    urls, r0, r1 = asyncio.run(main())
    assert len(set(urls)) == 2
    assert r0["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert r1["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}  # its own cache


def test_start_embedded_runs_beside_other_tasks():
    async def main():
        url, servers = await start_embedded(SimSettings(block_size=64))
        assert url.endswith("/v1")
        async with httpx.AsyncClient() as h:
            r = await h.get(url + "/models")
        for s in servers:
            s.should_exit = True
        await asyncio.wait([s.config.app.state.serve_task for s in servers])
        return r.json()

    body = asyncio.run(main())
    assert body["data"][0]["id"] == "sim-model"
