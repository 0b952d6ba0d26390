"""Bad input, auth, failover and upstream failures: the right status and error shape."""

from __future__ import annotations

import hashlib
import re

import anthropic
import httpx
import openai
import pytest

from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from tests.conftest import settled
from tests.fakes import Reply

GOOD_MSG = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
GOOD_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _keys(**extra):
    return {
        "keys": [
            {
                "name": "alice",
                "owner": "team-a",
                "key_sha256": hashlib.sha256(b"sk-alice").hexdigest(),
                "models": ["m"],
            },
            {"name": "bob", "key_sha256": hashlib.sha256(b"sk-bob").hexdigest()},
        ],
        **extra,
    }


def _assert_anthropic_error(r: httpx.Response, status: int, etype: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == etype
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert "Traceback" not in r.text
    return body


def _assert_openai_error(r: httpx.Response, status: int, etype: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if etype:
        assert err["type"] == etype
    assert "Traceback" not in r.text
    return err


BAD_MESSAGES = [
    (b"{not json", 400, "invalid_request_error"),
    (b"", 400, "invalid_request_error"),
    (b"[1,2]", 400, "invalid_request_error"),
    (b'{"model": "m", "messages": []}', 400, "invalid_request_error"),  # no max_tokens
    (b'{"model": 5, "max_tokens": 1, "messages": []}', 400, "invalid_request_error"),
    (b'{"model": "m", "max_tokens": 1, "messages": "hi"}', 400, "invalid_request_error"),
    (
        b'{"model": "m", "max_tokens": 1, "messages": [{"role": "robot", "content": "x"}]}',
        400,
        "invalid_request_error",
    ),
    (
        b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "bogus"}]}]}',
        400,
        "invalid_request_error",
    ),
    (
        b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": 3}]}',
        400,
        "invalid_request_error",
    ),
    (b'{"model": "m", "max_tokens": "lots", "messages": []}', 400, "invalid_request_error"),
    (
        b'{"model": "m", "max_tokens": 1, "messages": [], "tools": [{"description": "no name"}]}',
        400,
        "invalid_request_error",
    ),
    (
        b'{"model": "m", "max_tokens": 1, "messages": [], "tool_choice": {"type": "sometimes"}}',
        400,
        "invalid_request_error",
    ),
    (
        b'{"model": "m", "max_tokens": 1, "messages": [], "temperature": "hot"}',
        400,
        "invalid_request_error",
    ),
    (b'{"model": "m", "max_tokens": 1, "messages": [], "system": 7}', 400, "invalid_request_error"),
    (
        b'{"model": "m", "max_tokens": 1, "messages": [], "stream": "yes"}',
        400,
        "invalid_request_error",
    ),
    (b'{"model": "unknown-model", "max_tokens": 1, "messages": []}', 404, "not_found_error"),
    (b'{"a":' * 200 + b"1" + b"}" * 200, 400, "invalid_request_error"),  # too deep
]


@pytest.mark.parametrize(("raw", "status", "etype"), BAD_MESSAGES)
def test_bad_messages_requests(gateway, raw, status, etype):
    gw = gateway({"models": ["m"]})
    r = httpx.post(
        gw.url + "/v1/messages",
        content=raw,
        headers={"content-type": "application/json", "x-api-key": "k"},
    )
    _assert_anthropic_error(r, status, etype)
    assert gw.records[-1].status == status


BAD_CHAT = [
    (b"{not json", 400),
    (b'{"model": "m"}', 400),
    (b'{"model": "m", "messages": []}', 400),
    (b'{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}', 400),
    (b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', 400),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "warm"}', 400),
    (b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404),
]


@pytest.mark.parametrize(("raw", "status"), BAD_CHAT)
def test_bad_chat_requests(gateway, raw, status):
    gw = gateway({"models": ["m"]})
    r = httpx.post(
        gw.url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    _assert_openai_error(r, status)


def test_oversized_body(gateway):
    gw = gateway(limits={"max_body_bytes": 1000})
    big = {**GOOD_MSG, "messages": [{"role": "user", "content": "x" * 5000}]}
    r = httpx.post(gw.url + "/v1/messages", json=big)
    _assert_anthropic_error(r, 413, "request_too_large")
    r = httpx.post(gw.url + "/v1/chat/completions", json={**GOOD_CHAT, "messages": big["messages"]})
    _assert_openai_error(r, 413)


def test_a_body_sent_in_pieces_is_read_whole_and_held_to_the_limit(gateway, upstream):
    gw = gateway(limits={"max_body_bytes": 4000})
    text = "piece " * 300
    data = httpx.Request(
        "POST", "/", json={**GOOD_MSG, "messages": [{"role": "user", "content": text}]}
    ).content

    def pieces(raw: bytes):  # chunked transfer encoding, a piece per write
        for i in range(0, len(raw), 500):
            yield raw[i : i + 500]

    r = httpx.post(gw.url + "/v1/messages", content=pieces(data), headers={"x-api-key": "k"})
    assert r.status_code == 200, r.text
    assert upstream.requests[-1]["messages"][-1]["content"] == text
    r = httpx.post(gw.url + "/v1/messages", content=pieces(data + b" " * 3000))
    _assert_anthropic_error(r, 413, "request_too_large")


@pytest.mark.parametrize("pieces", [[b"abc"], [b"ab", b"", b"c"], [b"", b"a", b"bc"], [b"x"] * 5])
def test_the_body_is_read_whole_from_any_number_of_messages(pieces):
    """Servers that hand the body over in pieces (uvicorn does) give the same bytes;
    past the limit, 413 however it came."""
    import asyncio

    from starlette.requests import Request

    from prefixgate.config import Limits
    from prefixgate.errors import RequestTooLarge
    from prefixgate.pipeline.steps import read_body

    def request_of(parts):
        messages = [
            {"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
            for i, p in enumerate(parts)
        ]

        async def receive():
            return messages.pop(0)

        scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
        return Request(scope, receive)

    limit = Limits().max_body_bytes
    body = asyncio.run(read_body(request_of(pieces), limit))
    assert body == b"".join(pieces) and type(body) is bytes
    with pytest.raises(RequestTooLarge):
        asyncio.run(read_body(request_of([*pieces, b"y"]), 3))


def test_keys_auth_and_model_allowlist(gateway, upstream):
    gw = gateway({"models": ["m", "other"]}, **_keys())
    url = gw.url + "/v1/messages"
    _assert_anthropic_error(httpx.post(url, json=GOOD_MSG), 401, "authentication_error")
    _assert_anthropic_error(
        httpx.post(url, json=GOOD_MSG, headers={"x-api-key": "sk-wrong"}),
        401,
        "authentication_error",
    )
    assert httpx.post(url, json=GOOD_MSG, headers={"x-api-key": "sk-alice"}).status_code == 200
    assert (
        httpx.post(url, json=GOOD_MSG, headers={"authorization": "Bearer sk-alice"}).status_code
        == 200
    )
    assert gw.records[-1].key_name == "alice" and gw.records[-1].key_owner == "team-a"
    other = {**GOOD_MSG, "model": "other"}
    _assert_anthropic_error(
        httpx.post(url, json=other, headers={"x-api-key": "sk-alice"}), 403, "permission_error"
    )
    assert httpx.post(url, json=other, headers={"x-api-key": "sk-bob"}).status_code == 200
    # The SDKs raise their own typed errors.
    with anthropic.Anthropic(base_url=gw.url, api_key="sk-nope", max_retries=0) as client:
        with pytest.raises(anthropic.AuthenticationError):
            client.messages.create(**GOOD_MSG)
    with openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-alice", max_retries=0) as client:
        with pytest.raises(openai.PermissionDeniedError):
            client.chat.completions.create(**{**GOOD_CHAT, "model": "other"})
    # The key itself never appears in a record.
    assert all("sk-alice" not in repr(r) for r in gw.records)


def test_context_length_error_becomes_prompt_too_long(gateway, upstream):
    gw = gateway()
    msg = (
        "This model's maximum context length is 4096 tokens. However, you requested 9000 tokens "
        "(8000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion."
    )
    upstream.script = lambda b: Reply(
        status=400,
        error={"object": "error", "message": msg, "type": "BadRequestError", "code": 400},
    )
    r = httpx.post(gw.url + "/v1/messages", json=GOOD_MSG)
    body = _assert_anthropic_error(r, 400, "invalid_request_error")
    assert body["error"]["message"] == "prompt is too long: 8000 tokens > 4096 maximum"
    with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as client:
        with pytest.raises(
            anthropic.BadRequestError, match=r"prompt is too long: 8000 tokens > 4096 maximum"
        ):
            client.messages.create(**GOOD_MSG)
    err = _assert_openai_error(httpx.post(gw.url + "/v1/chat/completions", json=GOOD_CHAT), 400)
    assert err["code"] == "context_length_exceeded"
    # every failed record says why, as the client was told
    assert [r.error_message for r in gw.records] == [
        "prompt is too long: 8000 tokens > 4096 maximum"
    ] * 3


def test_max_tokens_clamped_when_only_it_overflows(gateway, upstream):
    gw = gateway()
    calls = []

    def script(body):
        calls.append(body["max_tokens"])
        if body["max_tokens"] > 4096 - 1000:
            return Reply(
                status=400,
                error={
                    "error": {
                        "message": "'max_tokens' or 'max_completion_tokens' is too large: 32000. This model's maximum "
                        "context length is 4096 tokens and your request has 1000 input tokens (32000 > 4096 - 1000)."
                    }
                },
            )
        return Reply(text="fits")

    upstream.script = script
    r = httpx.post(gw.url + "/v1/messages", json={**GOOD_MSG, "max_tokens": 32000})
    assert r.status_code == 200 and r.json()["content"][0]["text"] == "fits"
    assert calls == [32000, 3096]


def test_max_tokens_clamped_twice_as_sglang_asks(gateway, upstream):
    """SGLang 0.5.23 refuses max_tokens over the window without counting the prompt, then,
    at the window, prompt + max_tokens: two clamps, then the answer."""
    gw = gateway()
    calls = []

    def script(body):
        calls.append(body["max_tokens"])
        n = body["max_tokens"]
        if n > 4096:
            message = (
                f"max_completion_tokens is too large: {n}."
                "This model supports at most 4096 completion tokens."
            )
        elif n + 1000 > 4096:
            message = (
                "Requested token count exceeds the model's maximum context length of 4096 "
                f"tokens. You requested a total of {n + 1000} tokens: 1000 tokens from the "
                f"input messages and {n} tokens for the completion. Please reduce the number "
                "of tokens in the input messages or the completion to fit within the limit."
            )
        else:
            return Reply(text="fits")
        return Reply(status=400, error={"object": "error", "message": message, "code": 400})

    upstream.script = script
    r = httpx.post(gw.url + "/v1/messages", json={**GOOD_MSG, "max_tokens": 32000})
    assert r.status_code == 200 and r.json()["content"][0]["text"] == "fits"
    assert calls == [32000, 4096, 3096]


def test_failover_to_next_channel_before_first_byte(upstream):
    # Channel "dead" points at a closed port; "live" is the scripted upstream.
    from prefixgate.config import parse_config

    config = parse_config(
        {
            "channels": [
                {
                    "name": "dead",
                    "base_url": "http://127.0.0.1:9/v1",
                    "priority": 10,
                    "timeouts": {"connect": 1},
                },
                {"name": "live", "base_url": upstream.url, "priority": 0},
            ],
            "store": None,
        }
    )
    recs = []

    class R:
        def submit(self, rec):
            recs.append(rec)

    app = create_app(config, recorder=R())
    with ServerThread(app) as srv:
        r = httpx.post(srv.url + "/v1/messages", json={**GOOD_MSG, "stream": True})
        assert r.status_code == 200 and "event: message_stop" in r.text
        settled(app.state.gateway)  # the record closes just after the last byte
        assert recs[-1].channel == "live" and recs[-1].retries == 1
        r = httpx.post(srv.url + "/v1/chat/completions", json=GOOD_CHAT)
        settled(app.state.gateway)
        assert r.status_code == 200 and recs[-1].channel == "live"


def test_failover_on_5xx_and_all_failed(gateway, upstream):
    gw = gateway(
        channels=[
            {"name": "a", "base_url": upstream.url, "priority": 1},
            {"name": "b", "base_url": upstream.url.replace("/v1", "/v1/"), "priority": 0},
        ]
    )
    n = []

    def script(body):
        n.append(1)
        return (
            Reply(status=503, error={"error": {"message": "busy"}})
            if len(n) == 1
            else Reply(text="second")
        )

    upstream.script = script
    r = httpx.post(gw.url + "/v1/messages", json=GOOD_MSG)
    assert r.status_code == 200 and r.json()["content"][0]["text"] == "second"
    upstream.script = lambda b: Reply(status=500, error={"error": {"message": "boom"}})
    r = httpx.post(gw.url + "/v1/messages", json=GOOD_MSG)
    body = _assert_anthropic_error(r, 502, "api_error")
    assert "boom" in body["error"]["message"]
    assert gw.records[-1].error_message == body["error"]["message"]


def test_first_byte_timeout(gateway, upstream):
    gw = gateway({"timeouts": {"first_byte": 0.5}})
    upstream.script = lambda b: Reply(text="late", hang_before=3)  # answers, after 3 s
    r = httpx.post(gw.url + "/v1/messages", json=GOOD_MSG, timeout=10)
    _assert_anthropic_error(r, 504, "api_error")


def test_stream_dies_mid_way_gives_error_event(gateway, upstream):
    gw = gateway()
    upstream.script = lambda b: Reply(text="a b c d e f", die_after=3)
    r = httpx.post(gw.url + "/v1/messages", json={**GOOD_MSG, "stream": True}, timeout=10)
    assert r.status_code == 200
    events = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "error"
    assert "message_stop" not in events
    assert gw.records[-1].status >= 500
    assert gw.records[-1].error_message  # a failure after the first byte has its reason too


def test_invalid_json_in_stream(gateway, upstream):
    gw = gateway()
    upstream.script = lambda b: Reply(
        raw_stream=[b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n', b"data: {broken\n\n"]
    )
    r = httpx.post(gw.url + "/v1/messages", json={**GOOD_MSG, "stream": True}, timeout=10)
    assert r.text.rstrip().splitlines()[-2] == "event: error"
    r = httpx.post(gw.url + "/v1/chat/completions", json={**GOOD_CHAT, "stream": True}, timeout=10)
    assert '"error"' in r.text.rstrip().splitlines()[-1]


def test_unknown_route_and_method(gateway):
    gw = gateway()
    r = httpx.get(gw.url + "/v1/nothing-here")
    _assert_openai_error(r, 404)
    r = httpx.get(gw.url + "/v1/messages", headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 405 and r.json()["type"] == "error"


def test_query_string_and_head_root(gateway):
    gw = gateway()
    r = httpx.post(gw.url + "/v1/messages?beta=true", json=GOOD_MSG)
    assert r.status_code == 200
    assert httpx.head(gw.url + "/").status_code == 200
    assert httpx.get(gw.url + "/healthz").json() == {"status": "ok"}


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        # vLLM 0.32
        (
            "This model's maximum context length is 16384 tokens. However, your prompt contains "
            "at least 17000 input tokens, which exceeds this limit.",
            (16384, 17000),
        ),
        ("max_tokens=32000 cannot be greater than max_model_len=16384.", (16384, 0)),
        # older vLLM
        (
            "This model's maximum context length is 4096 tokens. However, you requested 9000 tokens "
            "(8000 in the messages, 1000 in the completion).",
            (4096, 8000),
        ),
        # SGLang (0.5.23, verbatim)
        (
            "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
            (4096, 5000),
        ),
        (
            "max_completion_tokens is too large: 30000.This model supports at most 16384 "
            "completion tokens.",
            (16384, 0),
        ),
        (
            "Requested token count exceeds the model's maximum context length of 16384 tokens. "
            "You requested a total of 16395 tokens: 11 tokens from the input messages and 16384 "
            "tokens for the completion. Please reduce the number of tokens in the input "
            "messages or the completion to fit within the limit.",
            (16384, 11),
        ),
        (
            "Input length (1710 tokens) exceeds the maximum allowed length (1530 tokens). Use a "
            "shorter input or enable --allow-auto-truncate.",
            (1530, 1710),
        ),
        ("something else went wrong", None),
    ],
)
def test_context_error_wordings(message, expected):
    from prefixgate.engine.errors import parse_context_error

    got = parse_context_error(message)
    assert (None if got is None else (got.maximum, got.prompt)) == expected


def test_oversized_headers_get_431_in_the_route_shape(gateway):
    gw = gateway(limits={"max_header_bytes": 4096})
    big = {"x-junk": "a" * 10_000}
    r = httpx.post(gw.url + "/v1/messages", json=GOOD_MSG, headers=big)
    assert r.status_code == 431 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(gw.url + "/v1/chat/completions", json=GOOD_CHAT, headers=big)
    assert r.status_code == 431 and r.json()["error"]["code"] == "headers_too_large"
    assert httpx.post(gw.url + "/v1/messages", json=GOOD_MSG).status_code == 200


def test_too_many_messages_tools_and_blocks(gateway):
    gw = gateway(limits={"max_messages": 5, "max_tools": 2, "max_blocks": 3})
    url = gw.url + "/v1/messages"
    many = {**GOOD_MSG, "messages": [{"role": "user", "content": "x"}] * 6}
    assert (
        "at most 5 messages"
        in _assert_anthropic_error(httpx.post(url, json=many), 400, "invalid_request_error")[
            "error"
        ]["message"]
    )
    tools = [{"name": f"t{i}", "input_schema": {"type": "object"}} for i in range(3)]
    _assert_anthropic_error(
        httpx.post(url, json={**GOOD_MSG, "tools": tools}), 400, "invalid_request_error"
    )
    blocks = [{"type": "text", "text": "x"}] * 4
    msg = {**GOOD_MSG, "messages": [{"role": "user", "content": blocks}]}
    _assert_anthropic_error(httpx.post(url, json=msg), 400, "invalid_request_error")
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}] * 6}
    _assert_openai_error(httpx.post(gw.url + "/v1/chat/completions", json=chat), 400)


def test_a_lower_bound_is_replaced_by_the_whole_prompts_estimate(gateway, upstream):
    """vLLM 0.32 stops counting at the window ("at least 16385"): the client is told the
    whole prompt's count in Anthropic's exact wording (so Claude Code compacts enough) —
    the upstream's /tokenize count, else the gateway's estimate; the record says which."""
    gw = gateway()
    msg = (
        "This model's maximum context length is 16384 tokens. However, your prompt contains "
        "at least 16385 input tokens, which exceeds this limit even without any output tokens."
    )
    upstream.script = lambda b: Reply(
        status=400, error={"object": "error", "message": msg, "type": "BadRequestError"}
    )
    long = {**GOOD_MSG, "messages": [{"role": "user", "content": "word " * 100_000}]}
    r = httpx.post(gw.url + "/v1/messages", json=long)
    text = _assert_anthropic_error(r, 400, "invalid_request_error")["error"]["message"]
    m = re.fullmatch(r"prompt is too long: (\d+) tokens > 16384 maximum", text)
    assert m and 100_000 <= int(m.group(1)) <= 140_000  # ≈ 500k chars / 4, not 16385
    reason = gw.records[-1].error_message
    assert reason.startswith(text) and "estimated by the gateway" in reason and "16385" in reason
    # an upstream with vLLM's /tokenize counts the prompt itself: its count is relayed
    upstream.tokenize_count = 102_001
    r = httpx.post(gw.url + "/v1/messages", json=long)
    assert _assert_anthropic_error(r, 400, "invalid_request_error")["error"]["message"] == (
        "prompt is too long: 102001 tokens > 16384 maximum"
    )
    assert "/tokenize" in gw.records[-1].error_message
    [asked] = [t for t in upstream.tokenized if t["messages"][-1]["content"].startswith("word")]
    assert asked["model"] and "max_tokens" not in asked
    # a count the upstream gave whole is relayed as it is
    upstream.script = lambda b: Reply(
        status=400,
        error={
            "message": msg.replace("prompt contains at least 16385", "request has 17000"),
            "type": "BadRequestError",
        },
    )
    r = httpx.post(gw.url + "/v1/messages", json=long)
    assert _assert_anthropic_error(r, 400, "invalid_request_error")["error"]["message"] == (
        "prompt is too long: 17000 tokens > 16384 maximum"
    )
