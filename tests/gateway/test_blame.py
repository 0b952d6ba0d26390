"""Errors blame the right party: an upstream 4xx caused by the request is the client's
error (never retried elsewhere, never held against a replica); garbage before any content
fails over like a 5xx; every answer names its record; a failing upstream is logged once
per interval."""

from __future__ import annotations

import json
import logging
import socket
import time
import uuid

import anthropic
import httpx
import openai
import pytest

from tests.conftest import settled
from tests.fakes import Reply

MSG = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
NO_SUCH_MODEL = {
    "object": "error",
    "message": "The model `mistyped` does not exist.",
    "type": "NotFoundError",
    "param": None,
    "code": 404,
}


def _two_channels(gateway, upstream):
    """Channels ``a`` (tried first) and ``b`` on the same scripted upstream, told apart by
    the model each sends."""
    return gateway(
        channels=[
            {"name": "a", "base_url": upstream.url, "priority": 2, "model_map": {"m": "first"}},
            {"name": "b", "base_url": upstream.url, "priority": 1, "model_map": {"m": "second"}},
        ]
    )


def test_an_unknown_model_upstream_is_the_clients_404_and_ejects_no_replica(gateway, upstream):
    calls = []

    def script(body):
        calls.append(body["model"])
        return Reply(status=404, error=NO_SUCH_MODEL)

    upstream.script = script
    gw = _two_channels(gateway, upstream)
    with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as client:
        for _ in range(5):
            with pytest.raises(anthropic.NotFoundError) as caught:
                client.messages.create(**MSG)
            assert caught.value.body["error"]["type"] == "not_found_error"
            assert "does not exist" in caught.value.body["error"]["message"]
    with openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0) as chat:
        with pytest.raises(openai.NotFoundError):
            chat.chat.completions.create(**CHAT)
    assert calls == ["first"] * 6  # never retried on the other channel
    settled(gw.gateway)
    assert [r.status for r in gw.records] == [404] * 6
    assert all(r.retries == 0 for r in gw.records)
    assert gw.gateway.router.healthy(upstream.url)  # the replica is not held to blame


def test_context_overflow_is_the_clients_400_and_not_retried(gateway, upstream):
    calls = []
    overflow = {
        "object": "error",
        "message": "This model's maximum context length is 16384 tokens. However, you "
        "requested 102001 tokens (102001 in the messages, 0 in the completion).",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }

    def script(body):
        calls.append(body["model"])
        return Reply(status=400, error=overflow)

    upstream.script = script
    gw = _two_channels(gateway, upstream)
    r = httpx.post(gw.url + "/v1/messages", json=MSG)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert calls == ["first"]
    assert gw.gateway.router.healthy(upstream.url)


@pytest.mark.parametrize("garbage", [b"data: <html>oops</html>\n\n", b"data: [1, 2]\n\n"])
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions"])
def test_garbage_as_the_first_event_fails_over_before_any_byte(gateway, upstream, garbage, path):
    calls = []

    def script(body):
        calls.append(body["model"])
        if body["model"] == "first":
            return Reply(raw_stream=[garbage])
        return Reply(text="from second")

    upstream.script = script
    gw = _two_channels(gateway, upstream)
    body = {**(MSG if path == "/v1/messages" else CHAT), "stream": True}
    r = httpx.post(gw.url + path, json=body)
    assert r.status_code == 200
    assert "second" in r.text.replace(" ", "") or "from" in r.text
    assert calls == ["first", "second"]
    settled(gw.gateway)
    assert gw.records[-1].channel == "b" and gw.records[-1].retries == 1


def test_every_answer_names_its_record(gateway, upstream):
    upstream.script = lambda b: Reply(text="ok")
    gw = gateway()
    with anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as client:
        msg = client.messages.create(**MSG)
        with client.messages.stream(**MSG) as stream:
            stream.until_done()
            streamed_id = stream.response.headers["request-id"]
    with openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0) as chat:
        completion = chat.chat.completions.create(**CHAT)
    bad = httpx.post(gw.url + "/v1/chat/completions", json={"model": "m"})
    assert bad.status_code == 400
    settled(gw.gateway)
    ids = [r.request_id for r in gw.records]
    assert ids == [
        msg._request_id,
        streamed_id,
        completion._request_id,
        bad.headers["x-request-id"],
    ]
    assert len(set(ids)) == 4


def test_a_records_id_is_a_uuid7_of_when_it_was_received(gateway, upstream):
    """The store's indexes on the id grow at their end: ids sort as the requests came."""
    upstream.script = lambda b: Reply(text="ok")
    gw = gateway()
    answered = []
    for _ in range(3):
        r = httpx.post(gw.url + "/v1/messages", json=MSG)
        assert r.status_code == 200
        answered.append(r.headers["request-id"])
        time.sleep(0.002)  # the next request in a later millisecond
    settled(gw.gateway)
    recs = gw.records
    assert [r.request_id for r in recs] == answered == sorted(answered)
    for rec in recs:
        u = uuid.UUID(hex=rec.request_id)
        assert u.version == 7 and u.variant == uuid.RFC_4122
        assert 0 <= rec.received_at * 1000 - (u.int >> 80) < 1000  # (its ms, give or take a pause)


def test_a_refused_connection_is_named_by_its_errno(gateway):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    gw = gateway({"base_url": f"http://127.0.0.1:{port}/v1"})
    r = httpx.post(gw.url + "/v1/messages", json=MSG)
    assert r.status_code == 502
    assert "ECONNREFUSED" in r.json()["error"]["message"]


def test_a_failing_upstream_is_logged_once_per_interval(gateway, caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gw = gateway({"base_url": f"http://127.0.0.1:{port}/v1"})
    with caplog.at_level(logging.WARNING, logger="prefixgate"):
        for _ in range(30):
            assert httpx.post(gw.url + "/v1/messages", json=MSG).status_code == 502
    lines = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    gw.gateway.failures.interval = 0.0  # the interval over: the next line counts the rest
    assert httpx.post(gw.url + "/v1/messages", json=MSG).status_code == 502
    lines = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert "and 29 more like it since" in lines[-1]
    assert json.dumps(lines)  # plain strings
