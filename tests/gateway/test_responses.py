"""``POST /v1/responses`` through the official ``openai`` SDK (``client.responses.create``),
over HTTP on loopback, against a scripted Chat Completions upstream: what the upstream
received, what the client read, what the record says."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.fakes import Reply

_OPEN: list = []


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _OPEN:
        _OPEN.pop().close()


def client(gw, **kw) -> openai.OpenAI:
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key="test-key", max_retries=0, **kw)
    _OPEN.append(c)
    return c


TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
        },
    },
    {
        "type": "namespace",
        "name": "agents",
        "description": "Sub-agents.",
        "tools": [
            {
                "type": "function",
                "name": "spawn",
                "description": "Start one.",
                "parameters": {"type": "object", "properties": {"task": {"type": "string"}}},
            }
        ],
    },
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch."},
    {"type": "web_search", "external_web_access": False},
]


def test_non_streaming_text_usage_and_what_went_upstream(gateway, upstream):
    gw = gateway()
    upstream.script = lambda b: Reply(
        text="Hi there", prompt_tokens=1000, cached_tokens=768, completion_tokens=5
    )
    raw = client(gw).responses.with_raw_response.create(
        model="m",
        instructions="Be brief.",
        input="hello",
        max_output_tokens=50,
        temperature=0.5,
        store=False,
        prompt_cache_key="sess-1",
    )
    resp = raw.parse()
    request_id = raw.headers["x-request-id"]
    assert resp.output_text == "Hi there" and resp.status == "completed"
    assert resp.object == "response" and resp.model == "m" and resp.id.startswith("resp_")
    assert resp.instructions == "Be brief." and resp.max_output_tokens == 50
    (item,) = resp.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    # OpenAI semantics: input_tokens includes the cached part
    u = resp.usage
    assert (u.input_tokens, u.input_tokens_details.cached_tokens) == (1000, 768)
    assert (u.output_tokens, u.total_tokens, u.output_tokens_details.reasoning_tokens) == (
        5,
        1005,
        0,
    )
    assert upstream.requests[-1] == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hello"},
        ],
        "max_tokens": 50,
        "temperature": 0.5,
    }
    rec = gw.records[-1]
    assert rec.request_id == request_id and rec.endpoint == "responses" and rec.status == 200
    assert (rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens) == (1000, 768, 5)
    assert (rec.reported_input_tokens, rec.reported_cache_read_tokens) == (1000, 768)
    assert (rec.session_id, rec.session_kind) == ("sess-1", "prompt-cache-key")
    assert rec.client == "openai-python"


def test_streaming_reasoning_text_and_tools_in_the_responses_event_sequence(gateway, upstream):
    gw = gateway()
    upstream.script = lambda b: Reply(
        reasoning="Let me look.",
        text="Running it.",
        tool_calls=[
            {"id": "call_1", "name": "exec_command", "arguments": '{"cmd": "ls -la"}'},
            {"id": "call_2", "name": "agents__spawn", "arguments": '{"task": "x"}'},
            {"id": "call_3", "name": "apply_patch", "arguments": '{"input": "*** Begin"}'},
        ],
        finish_reason="tool_calls",
        prompt_tokens=500,
        cached_tokens=448,
        completion_tokens=30,
    )
    events = list(
        client(gw).responses.create(
            model="m",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "list files"}]}],
            tools=TOOLS,
            stream=True,
        )
    )
    types = [e.type for e in events]
    item = [
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types == [
        "response.created",
        "response.in_progress",
        *item,
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        *item,
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * 2,
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * 2,
        "response.output_item.added",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # as OpenAI sends it, the arguments' done event names the function (a field newer
    # than this SDK's model of the event, which keeps it as an extra)
    dones = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [(e.name, e.arguments) for e in dones] == [
        ("exec_command", '{"cmd": "ls -la"}'),
        ("spawn", '{"task": "x"}'),
    ]
    done = events[-1].response
    reasoning, message, call, spawn, patch = done.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "Let me look."
    assert message.content[0].text == "Running it."
    assert (call.type, call.call_id, call.name, call.arguments) == (
        "function_call",
        "call_1",
        "exec_command",
        '{"cmd": "ls -la"}',
    )
    assert (spawn.name, spawn.namespace, spawn.call_id) == ("spawn", "agents", "call_2")
    assert (patch.type, patch.name, patch.input, patch.call_id) == (
        "custom_tool_call",
        "apply_patch",
        "*** Begin",
        "call_3",
    )
    # each item's id is the one its deltas named
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    assert added == [i.id for i in done.output]
    assert done.usage.input_tokens == 500 and done.usage.input_tokens_details.cached_tokens == 448
    sent = upstream.requests[-1]
    assert [t["function"]["name"] for t in sent["tools"]] == [
        "exec_command",
        "agents__spawn",
        "apply_patch",
    ]  # the hosted web_search is not sent
    assert sent["tools"][2]["function"]["parameters"]["required"] == ["input"]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["messages"] == [{"role": "user", "content": "list files"}]
    rec = gw.records[-1]
    assert rec.stream and rec.status == 200 and rec.cached_tokens == 448


def test_a_conversation_goes_upstream_as_chat_with_its_turns_in_place(gateway, upstream):
    """Codex's shape: developer messages first, then turns of user text, reasoning,
    function calls and their outputs (an image among them), a developer note mid-way."""
    gw = gateway()
    upstream.script = lambda b: Reply(text="done")
    png = "data:image/png;base64,iVBORw0KGgo="
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "A"}]},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "B"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "hmm"}],
            "encrypted_content": None,
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "c1",
            "name": "exec_command",
            "arguments": '{"cmd":"ls"}',
        },
        {
            "type": "function_call",
            "call_id": "c2",
            "name": "spawn",
            "namespace": "agents",
            "arguments": "{}",
        },
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [
                {"type": "input_text", "text": "see"},
                {"type": "input_image", "image_url": png},
            ],
        },
        {"type": "custom_tool_call", "call_id": "c3", "name": "apply_patch", "input": "*** X"},
        {"type": "custom_tool_call_output", "call_id": "c3", "output": "ok"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi"}],
        },
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "C"}]},
        {"role": "user", "content": "next"},
    ]
    client(gw).responses.create(model="m", input=items, tools=TOOLS, reasoning={"effort": "high"})
    sent = upstream.requests[-1]
    assert sent["messages"] == [
        {"role": "system", "content": "A\n\nB"},
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "hmm",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "exec_command", "arguments": '{"cmd":"ls"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "agents__spawn", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "c2", "content": "see"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": png}}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c3",
                    "type": "function",
                    "function": {"name": "apply_patch", "arguments": '{"input":"*** X"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c3", "content": "ok"},
        {"role": "assistant", "content": "Hi"},
        {"role": "system", "content": "C"},
        {"role": "user", "content": "next"},
    ]
    assert sent["chat_template_kwargs"] == {"enable_thinking": True}


@pytest.mark.parametrize(
    ("thinking", "effort", "expected"),
    [
        ("chat_template_kwargs", "none", {"chat_template_kwargs": {"enable_thinking": False}}),
        ("reasoning_effort", "xhigh", {"reasoning_effort": "high"}),
        ("reasoning_effort", "minimal", {"reasoning_effort": "low"}),
        ("reasoning_effort", "none", {}),
        ("drop", "high", {}),
    ],
)
def test_reasoning_effort_is_mapped_like_anthropic_thinking(
    gateway, upstream, thinking, effort, expected
):
    gw = gateway({"thinking": thinking})
    client(gw).responses.create(model="m", input="x", reasoning={"effort": effort})
    sent = upstream.requests[-1]
    got = {k: sent[k] for k in ("chat_template_kwargs", "reasoning_effort") if k in sent}
    assert got == expected


def test_the_same_request_gives_the_same_upstream_bytes(gateway, upstream):
    gw = gateway()
    body = {
        "model": "m",
        "input": [{"role": "user", "content": "héllo \u2028 \\u00e9"}],
        "tools": TOOLS,
        "client_metadata": {"turn_id": "a"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "k",
    }
    for turn in ("a", "b"):
        body["client_metadata"] = {"turn_id": turn}  # moves every turn; never sent
        httpx.post(gw.url + "/v1/responses", json=body, timeout=10).raise_for_status()
    assert upstream.raw[0] == upstream.raw[1]
    assert b"turn_id" not in upstream.raw[0] and b"prompt_cache_key" not in upstream.raw[0]


def test_codex_session_headers_name_the_session(gateway, upstream):
    gw = gateway()
    headers = {
        "session-id": "0199-abc",
        "originator": "codex_exec",
        "user-agent": "codex_exec/0.171.0 (Debian 12.0.0; x86_64) xterm",
    }
    httpx.post(
        gw.url + "/v1/responses",
        json={"model": "m", "input": "hi", "prompt_cache_key": "0199-abc"},
        headers=headers,
        timeout=10,
    ).raise_for_status()
    rec = gw.records[-1]
    assert (rec.session_id, rec.session_kind) == ("0199-abc", "codex")
    assert (rec.client, rec.client_version) == ("codex_exec", "0.171.0")


def test_a_failure_after_the_stream_started_is_response_failed(gateway, upstream):
    gw = gateway()
    upstream.script = lambda b: Reply(text="one two three four", die_after=3)
    events = list(client(gw).responses.create(model="m", input="x", stream=True))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.failed"
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.message
    assert json.dumps(failed.error.code)  # a code string, for Codex to act on
    assert gw.records[-1].status >= 500


def test_an_upstream_error_before_the_first_byte_is_in_the_openai_envelope(gateway, upstream):
    gw = gateway()
    upstream.script = lambda b: Reply(
        status=400,
        error={
            "object": "error",
            "message": "This model's maximum context length is 100 tokens. However, you"
            " requested 500 tokens (500 in the messages, 0 in the completion).",
            "type": "BadRequestError",
            "code": 400,
        },
    )
    with pytest.raises(openai.BadRequestError) as info:
        client(gw).responses.create(model="m", input="x" * 50, stream=True)
    # the code Codex acts on (it compacts), with the figures
    assert info.value.code == "context_length_exceeded"
    assert info.value.message.endswith("prompt is too long: 500 tokens > 100 maximum")
    assert gw.records[-1].status == 400 and gw.records[-1].endpoint == "responses"
