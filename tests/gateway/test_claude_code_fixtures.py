"""Real Claude Code requests through the gateway: billing header gone upstream, order kept,
mid-conversation system message in place, stream readable by the official SDK."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from prefixgate.hygiene.billing import PREFIX
from tests.conftest import fixture_names, load_fixture
from tests.fakes import Reply

NAMES = fixture_names()

_SEND_HEADERS = {
    "anthropic-version",
    "anthropic-beta",
    "user-agent",
    "x-app",
    "x-claude-code-session-id",
}


def _send(gw, fx: dict, stream: bool | None = None) -> httpx.Response:
    body = dict(fx["body"])
    if stream is not None:
        body["stream"] = stream
    headers = {k: v for k, v in fx["headers"].items() if k.lower() in _SEND_HEADERS}
    headers["x-api-key"] = "sk-test"
    return httpx.post(gw.url + fx["path"], json=body, headers=headers, timeout=30)


@pytest.mark.parametrize("name", NAMES)
def test_upstream_request_is_cache_safe(gateway, upstream, name):
    fx = load_fixture(name)
    body = fx["body"]
    gw = gateway()
    upstream.script = lambda b: Reply(text="ok", prompt_tokens=20000, cached_tokens=17920)
    r = _send(gw, fx)
    assert r.status_code == 200, r.text
    sent = upstream.requests[-1]
    # No billing header anywhere upstream.
    assert PREFIX not in upstream.raw[-1].decode()
    # The system prompt is system[1] + system[2], in order, at the start.
    expected_system = "\n".join(
        b["text"] for b in body["system"] if not b["text"].startswith(PREFIX)
    )
    assert sent["messages"][0] == {"role": "system", "content": expected_system}
    # Tools kept, in order, schemas untouched.
    assert [t["function"]["name"] for t in sent.get("tools", [])] == [
        t["name"] for t in body.get("tools", [])
    ]
    for t_in, t_out in zip(body.get("tools", []), sent.get("tools", []), strict=True):
        assert t_out["function"]["parameters"] == t_in["input_schema"]
    # Every message kept in place, including a mid-conversation system message.
    roles_in = [m["role"] for m in body["messages"]]
    roles_out = [m["role"] for m in sent["messages"][1:]]
    assert roles_out == roles_in
    for i, m in enumerate(body["messages"]):
        if m["role"] == "system":
            assert sent["messages"][1 + i]["role"] == "system"
    # Anthropic-only fields dropped; no cache_control leaks upstream.
    raw = upstream.raw[-1].decode()
    for field in (
        "cache_control",
        "context_management",
        "output_config",
        "defer_loading",
        "safeguards",
    ):
        assert f'"{field}"' not in raw
    # The record keeps who and what.
    rec = gw.records[-1]
    assert (
        rec.client == "claude-cli" and rec.session_id == fx["headers"]["X-Claude-Code-Session-Id"]
    )
    assert rec.session_kind == "claude-code"


@pytest.mark.parametrize("name", NAMES)
def test_sdk_reads_the_converted_stream(gateway, upstream, name):
    fx = load_fixture(name)
    gw = gateway()
    upstream.script = lambda b: Reply(
        reasoning="hmm", text="Done.", prompt_tokens=30000, cached_tokens=29952
    )
    r = _send(gw, fx, stream=True)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    # Feed the raw SSE bytes to the official SDK's stream reader.
    client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
    body = {
        k: v
        for k, v in fx["body"].items()
        if k in ("model", "max_tokens", "messages", "system", "tools", "metadata")
    }
    with client.messages.stream(**body) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.usage.input_tokens == 48 and final.usage.cache_read_input_tokens == 29952
    events = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert events[-2] == "message_delta"


@pytest.mark.parametrize("name", NAMES)
def test_identical_prefix_gives_identical_upstream_bytes(gateway, upstream, name):
    fx = load_fixture(name)
    gw = gateway()
    _send(gw, fx)
    first = upstream.raw[-1]
    # Same request with a different per-request billing header and moved cache markers.
    body = json.loads(json.dumps(fx["body"]))
    body["system"][0]["text"] = body["system"][0]["text"].rstrip() + " cch=7ee55;"
    for b in body["system"]:
        b.pop("cache_control", None)
    _send(gw, {**fx, "body": body})
    assert upstream.raw[-1] == first


def test_billing_header_kept_when_switched_off(gateway, upstream):
    fx = load_fixture(NAMES[0])
    gw = gateway({"strip_anthropic_billing_header": False})
    _send(gw, fx)
    assert upstream.requests[-1]["messages"][0]["content"].startswith(PREFIX)


def test_anthropic_channel_passthrough_keeps_header(gateway, upstream):
    fx = load_fixture(NAMES[0])
    gw = gateway({"kind": "anthropic", "base_url": upstream.url})
    r = _send(gw, fx, stream=False)
    assert r.status_code == 200, r.text
    sent = upstream.requests[-1]
    assert sent["system"][0]["text"].startswith(PREFIX)
    assert sent == fx["body"] | {"stream": False}
    assert r.json()["content"][0]["text"] == "anthropic upstream"
    rec = gw.records[-1]
    assert rec.prompt_tokens == 100 and rec.cached_tokens == 90
    r = _send(gw, fx, stream=True)
    assert "event: message_stop" in r.text
    assert gw.records[-1].completion_tokens == 3
