"""Secrets never reach a log line, an error message, a record or a capture."""

from __future__ import annotations

import hashlib
import json
import logging

import httpx

from tests.fakes import Reply

CLIENT_KEY = "sk-client-0123456789abcdefSECRET"
UPSTREAM_KEY = "sk-upstream-9876543210zyxwvuSECRET"
MSG = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


def test_keys_are_never_logged_echoed_or_recorded(gateway, upstream, monkeypatch, caplog):
    monkeypatch.setenv("UPSTREAM_KEY_ENV", UPSTREAM_KEY)
    gw = gateway(
        {"api_key_env": "UPSTREAM_KEY_ENV", "capture_text": True},
        keys=[{"name": "k", "key_sha256": hashlib.sha256(CLIENT_KEY.encode()).hexdigest()}],
    )
    caplog.set_level(logging.DEBUG)
    h = {"x-api-key": CLIENT_KEY}

    # The upstream gets its own key, never the client's.
    assert httpx.post(gw.url + "/v1/messages", json=MSG, headers=h).status_code == 200
    assert upstream.headers[-1]["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert (
        CLIENT_KEY not in str(upstream.headers[-1]) and CLIENT_KEY not in upstream.raw[-1].decode()
    )

    # A misbehaving upstream echoes the credentials it received in its error message.
    upstream.script = lambda b: Reply(
        status=500, error={"error": {"message": f"bad auth header: Bearer {UPSTREAM_KEY}"}}
    )
    r = httpx.post(gw.url + "/v1/messages", json=MSG, headers=h)
    assert r.status_code == 502 and UPSTREAM_KEY not in r.text and "<redacted>" in r.text
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        headers=h,
    )
    assert UPSTREAM_KEY not in r.text

    # A secret typed into a prompt is redacted from captured texts.
    upstream.script = lambda b: Reply(text="ok")
    leaky = {**MSG, "messages": [{"role": "user", "content": f"my key is {UPSTREAM_KEY}"}]}
    assert httpx.post(gw.url + "/v1/messages", json=leaky, headers=h).status_code == 200

    # Wrong keys are refused without echoing them.
    r = httpx.post(
        gw.url + "/v1/messages", json=MSG, headers={"x-api-key": "sk-wrong-key-123456789"}
    )
    assert r.status_code == 401 and "sk-wrong-key" not in r.text

    for secret in (CLIENT_KEY, UPSTREAM_KEY):
        assert secret not in caplog.text
        for rec in gw.records:
            assert secret not in repr(msgspec_dump(rec))
    # No request content in the process log by default.
    assert "my key is" not in caplog.text and "hi" not in [m.getMessage() for m in caplog.records]


def msgspec_dump(rec):
    import msgspec

    return msgspec.json.encode(rec).decode()


def test_an_error_inside_a_stream_that_echoes_the_upstream_key_is_scrubbed(
    gateway, upstream, monkeypatch
):
    monkeypatch.setenv("UPSTREAM_KEY_ENV", UPSTREAM_KEY)
    gw = gateway({"api_key_env": "UPSTREAM_KEY_ENV"})
    echoed = {"error": {"message": f"token Bearer {UPSTREAM_KEY} is over its quota"}}
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    upstream.script = lambda b: Reply(
        raw_stream=[
            b"data: " + json.dumps(role).encode() + b"\n\n",
            b"data: " + json.dumps(echoed).encode() + b"\n\n",
        ]
    )
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    for path, body in (("/v1/messages", {**MSG, "stream": True}), ("/v1/chat/completions", chat)):
        r = httpx.post(gw.url + path, json=body)
        assert r.status_code == 200  # the stream had started
        assert "over its quota" in r.text, r.text  # the error reaches the client…
        assert UPSTREAM_KEY not in r.text and "<redacted>" in r.text  # …without the key
