"""Fault injection: upstreams that throttle, drip, answer in the wrong content type; clients
that leave mid-stream; keys over their rate limits."""

from __future__ import annotations

import asyncio
import hashlib
import time

import httpx
import pytest
from starlette.responses import Response

from tests.fakes import Reply

MSG = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


def test_429_with_retry_after_reaches_the_client_when_nothing_else_serves(gateway, upstream):
    gw = gateway()
    upstream.script = lambda b: Reply(
        status=429, error={"error": {"message": "slow down"}}, headers={"retry-after": "7"}
    )
    r = httpx.post(gw.url + "/v1/messages", json=MSG)
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert r.json()["error"]["type"] == "rate_limit_error"
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"


def test_503_fails_over_to_the_next_channel(gateway, upstream):
    calls = []

    def script(body):
        calls.append(body["model"])
        if body["model"] == "first":
            return Reply(
                status=503, error={"error": {"message": "overloaded"}}, headers={"retry-after": "1"}
            )
        return Reply(text="from second")

    upstream.script = script
    gw = gateway(
        channels=[
            {"name": "a", "base_url": upstream.url, "priority": 2, "model_map": {"m": "first"}},
            {"name": "b", "base_url": upstream.url, "priority": 1, "model_map": {"m": "second"}},
        ]
    )
    r = httpx.post(gw.url + "/v1/messages", json=MSG)
    assert r.status_code == 200 and r.json()["content"][0]["text"] == "from second"
    assert calls == ["first", "second"] and gw.records[-1].channel == "b"


def test_wrong_content_type_fails_over(gateway, upstream):
    async def html(request):
        return Response("<html>bad gateway</html>", media_type="text/html")

    upstream.app.router.routes.insert(0, _route("/v2/chat/completions", html))
    gw = gateway(
        channels=[
            {"name": "html", "base_url": upstream.url.replace("/v1", "/v2"), "priority": 2},
            {"name": "ok", "base_url": upstream.url, "priority": 1},
        ]
    )
    r = httpx.post(gw.url + "/v1/messages", json=MSG)
    assert r.status_code == 200 and gw.records[-1].channel == "ok"
    assert gw.records[-1].retries == 1
    # The failed target is now ejected for a cool-down: the next request goes straight on.
    r = httpx.post(gw.url + "/v1/messages", json={**MSG, "stream": True})
    assert r.status_code == 200 and "message_stop" in r.text and gw.records[-1].channel == "ok"


def _route(path, endpoint):
    from starlette.routing import Route

    return Route(path, endpoint, methods=["POST"])


def test_slow_drip_hits_the_idle_timeout(gateway, upstream):
    gw = gateway({"timeouts": {"idle": 0.5}})
    upstream.script = lambda b: Reply(text="a b c d e f g", chunk_delay=2.0)
    # Seven chunks 2 s apart: without the idle timeout the stream would end normally.
    r = httpx.post(gw.url + "/v1/messages", json={**MSG, "stream": True}, timeout=30)
    events = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    assert events[-1] == "error" and "message_stop" not in events
    assert gw.records[-1].error_type == "timeout_error"


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions"])
def test_client_leaving_mid_stream_cancels_the_upstream_within_a_second(gateway, upstream, path):
    gw = gateway()
    upstream.script = lambda b: Reply(text=" ".join(["word"] * 200), chunk_delay=0.05)
    body = (
        MSG
        if path == "/v1/messages"
        else {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )

    async def leave_early():
        async with httpx.AsyncClient(timeout=30) as client:
            async with client.stream("POST", gw.url + path, json={**body, "stream": True}) as r:
                async for _ in r.aiter_raw():
                    break  # read one chunk, then hang up

    asyncio.run(leave_early())
    # The stream lasts 10 s; an upstream read to its end is never cancelled (the wait is a
    # guard against a hang, not a speed bound).
    t0 = time.monotonic()
    while upstream.cancelled == 0 and time.monotonic() - t0 < 30:
        time.sleep(0.02)
    assert upstream.cancelled == 1, "the upstream request was not cancelled"
    deadline = time.monotonic() + 2
    while not gw.records and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gw.records[-1].status == 499 and gw.records[-1].error_type == "client_disconnected"


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions"])
def test_client_leaving_before_a_one_shot_answer_cancels_the_upstream(gateway, upstream, path):
    gw = gateway()
    upstream.script = lambda b: Reply(text="late", hang_before=5)
    body = (
        MSG
        if path == "/v1/messages"
        else {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )

    async def leave_early():
        async with httpx.AsyncClient(timeout=30) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post(gw.url + path, json=body, timeout=0.3)

    asyncio.run(leave_early())
    # An upstream left to answer after its 5 s is never cancelled (the wait is a guard
    # against a hang, not a speed bound).
    t0 = time.monotonic()
    while upstream.cancelled == 0 and time.monotonic() - t0 < 30:
        time.sleep(0.02)
    assert upstream.cancelled == 1, "the upstream request was not cancelled"
    assert gw.records[-1].status == 499 and gw.records[-1].error_type == "client_disconnected"


def test_per_key_rate_and_concurrency_limits(gateway, upstream):
    key = "sk-limited"
    gw = gateway(
        keys=[{"name": "lim", "key_sha256": hashlib.sha256(key.encode()).hexdigest(), "rpm": 2}]
    )
    h = {"x-api-key": key}
    assert httpx.post(gw.url + "/v1/messages", json=MSG, headers=h).status_code == 200
    assert httpx.post(gw.url + "/v1/messages", json=MSG, headers=h).status_code == 200
    r = httpx.post(gw.url + "/v1/messages", json=MSG, headers=h)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["type"] == "rate_limit_error"
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        headers=h,
    )
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
    assert gw.records[-1].status == 429


def test_concurrency_limit_through_the_gateway(gateway, upstream):
    key = "sk-conc"
    gw = gateway(
        keys=[
            {
                "name": "c",
                "key_sha256": hashlib.sha256(key.encode()).hexdigest(),
                "max_concurrency": 2,
            }
        ]
    )
    upstream.script = lambda b: Reply(text="slow", hang_before=0.5)

    async def burst():
        async with httpx.AsyncClient(timeout=30, headers={"x-api-key": key}) as client:
            rs = await asyncio.gather(
                *(client.post(gw.url + "/v1/messages", json=MSG) for _ in range(5))
            )
            return sorted(r.status_code for r in rs)

    assert asyncio.run(burst()) == [200, 200, 429, 429, 429]
    # Slots come back when requests end.
    assert (
        httpx.post(
            gw.url + "/v1/messages", json=MSG, headers={"x-api-key": key}, timeout=30
        ).status_code
        == 200
    )
