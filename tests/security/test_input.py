"""Rows 1, 5 and 10 of the security review (issue 29): what a client gets wrong in a body
is refused in its own protocol (400) before anything leaves, whichever entry point and
wherever in the body it sits; and one request's content cannot eject replicas."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.conftest import scripted_upstream
from tests.fakes import Reply

CHAT = b'{"model":"m","messages":[{"role":"user","content":"%s"}]%s}'
ROUTES = {
    "/v1/messages": b'{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"%s"}]%s}',
    "/v1/messages/count_tokens": b'{"model":"m","messages":[{"role":"user","content":"%s"}]%s}',
    "/v1/chat/completions": CHAT,
    "/v1/responses": b'{"model":"m","input":"%s"%s}',
}


def anthropic_shape(doc: dict) -> bool:
    return doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"


def openai_shape(doc: dict) -> bool:
    return doc["error"]["type"] == "invalid_request_error" and "message" in doc["error"]


def refused(resp: httpx.Response, route: str) -> str:
    assert resp.status_code == 400, resp.text
    doc = resp.json()
    assert (anthropic_shape if "messages" in route else openai_shape)(doc), doc
    return doc["error"]["message"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("where", "content", "extra"),
    [
        ("content", b"\xff", b""),
        ("model", b"x", b',"model":"\xfe"'),
        ("unknown field", b"x", b',"zz":"\xc3\x28"'),
        ("tool description", b"x", b',"tools":[{"name":"t","description":"\xff"}]'),
    ],
)
def test_bytes_that_are_not_utf8_are_a_400_everywhere(gateway, route, where, content, extra):
    gw = gateway()
    body = ROUTES[route] % (content, extra)
    resp = httpx.post(gw.url + route, content=body, headers={"content-type": "application/json"})
    assert "not valid UTF-8" in refused(resp, route)
    assert gw.upstream.requests == []  # nothing forwarded
    assert [r.status for r in gw.records] == [400]  # count_tokens' too


def test_chat_tools_with_bad_bytes_are_not_forwarded(gateway):
    """The chat route keeps ``tools`` raw and sends it on verbatim: it was forwarded."""
    gw = gateway()
    tools = b',"tools":[{"type":"function","function":{"name":"t","description":"\xff"}}]'
    resp = httpx.post(gw.url + "/v1/chat/completions", content=CHAT % (b"hi", tools))
    refused(resp, "/v1/chat/completions")
    assert gw.upstream.requests == []


@pytest.mark.parametrize("route", ROUTES)
def test_a_lone_surrogate_is_named_as_such(gateway, route):
    gw = gateway()
    for lone in (b"\\ud800", b"\\udc00", b"a\\ud83dz"):
        resp = httpx.post(gw.url + route, content=ROUTES[route] % (lone, b""))
        assert "lone UTF-16 surrogate" in refused(resp, route)
    # a pair, and an escaped backslash before "ud800", are text
    gw.upstream.script = lambda body: Reply(text="ok")
    for fine in (b"\\ud83d\\ude00", b"\\\\ud800"):
        resp = httpx.post(gw.url + route, content=ROUTES[route] % (fine, b""))
        assert resp.status_code == 200, resp.text


def test_a_malformed_chat_tool_is_refused_before_it_leaves(gateway):
    """Seen by the official SDK: a 400 naming the field, nothing sent upstream."""
    gw = gateway()
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
    bad_tools = [
        ({"type": "function", "function": {"name": 5, "parameters": "x"}}, "function.name"),
        ({"type": "function", "function": {"name": "t", "parameters": "x"}}, "parameters"),
        ({"type": "function", "function": {"name": "t", "description": 3}}, "description"),
        ({"type": "function", "function": {"name": ""}}, "function.name"),
        ({"type": "web_search"}, "tools[0]"),
    ]
    for tool, names in bad_tools:
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], tools=[tool]
            )
        assert names in exc.value.body["message"], exc.value.body
    assert gw.upstream.requests == []
    good = {"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}
    client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], tools=[good]
    )
    assert len(gw.upstream.requests) == 1


@pytest.mark.parametrize("value", [b"1e30", b"9223372036854775808", b"0", b"-1", b"2147483648"])
def test_token_counts_out_of_range_are_refused(gateway, value):
    gw = gateway()
    bodies = {
        "/v1/messages": b'{"model":"m","max_tokens":%s,"messages":[{"role":"user","content":"x"}]}',
        "/v1/chat/completions": CHAT.replace(b"%s}", b'%s,"max_tokens":') + b"%s}",
        "/v1/responses": b'{"model":"m","input":"x","max_output_tokens":%s}',
    }
    for route, body in bodies.items():
        raw = body % value if route != "/v1/chat/completions" else body % (b"x", b"", value)
        message = refused(httpx.post(gw.url + route, content=raw), route)
        assert not message.endswith(" - at"), message
        assert "max_" in message
    assert gw.upstream.requests == []


def test_responses_errors_name_the_field_cleanly(gateway):
    gw = gateway()
    resp = httpx.post(gw.url + "/v1/responses", json={"model": "m", "input": "x", "top_p": "a"})
    message = refused(resp, "/v1/responses")
    assert message.startswith("top_p: ") and " - at" not in message


def test_one_requests_internal_error_ejects_no_replica(gateway):
    """A request an upstream cannot digest (500 on every replica) fails over and gets 502,
    but no replica is ejected; two different requests failing on a replica eject it."""
    with scripted_upstream() as second:
        gw = gateway({"replicas": [second.url], "routing": {"policy": "round_robin"}})
        broken = {"error": {"message": "internal error", "type": "InternalServerError"}}
        for up in (gw.upstream, second):
            up.script = lambda body: Reply(status=500, error=broken)
        client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
        msg = {"role": "user", "content": "the same poison"}
        for _ in range(3):
            with pytest.raises(anthropic.InternalServerError):
                client.messages.create(model="m", max_tokens=5, messages=[msg])
        router = gw.gateway.router
        assert not router.is_ejected(gw.upstream.url) and not router.is_ejected(second.url)
        # another request's content failing there too: now the replica is to blame
        other = {"role": "user", "content": "something else"}
        with pytest.raises(anthropic.InternalServerError):
            client.messages.create(model="m", max_tokens=5, messages=[other])
        assert router.is_ejected(gw.upstream.url) or router.is_ejected(second.url)
        assert json.dumps([r.status for r in gw.records]) == "[502, 502, 502, 502]"
