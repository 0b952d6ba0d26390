"""Admission: a cap on requests in flight, a bounded queue with a deadline, then the
protocol's own overloaded answer with retry-after, before any upstream work, and recorded.
Over loopback, against the scripted upstream with its streams held open until the test lets go."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from prefixgate.admission import Gate
from prefixgate.errors import AtCapacity
from tests.conftest import settled
from tests.fakes import Reply


@pytest.fixture
def hold(upstream):
    """Every stream sends its first chunk, then waits until the test sets this."""
    release = threading.Event()
    upstream.script = lambda body: Reply(text="Hi there", hold=release)
    yield release
    release.set()


def _until(cond, what: str) -> None:
    deadline = time.monotonic() + 30  # a hang guard, not a measurement
    while not cond():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.005)


MESSAGES = {
    "model": "m",
    "max_tokens": 16,
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
}
CHAT = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def _post(url: str, path: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as c:
        r = await c.post(url + path, json=body, headers={"anthropic-version": "2023-06-01"})
        await r.aread()
        return r


def test_past_the_cap_a_request_waits_and_past_the_queue_gets_529_before_any_upstream_work(
    gateway, upstream, hold
):
    gw = gateway(
        None,
        server={"max_in_flight": 2, "max_queued": 1, "queue_timeout": 60},
    )
    admission = gw.gateway.admission

    async def main():
        holders = [asyncio.create_task(_post(gw.url, "/v1/messages", MESSAGES)) for _ in range(2)]
        await asyncio.to_thread(_until, lambda: len(upstream.requests) == 2, "two streams upstream")
        waiting = asyncio.create_task(_post(gw.url, "/v1/messages", MESSAGES))
        await asyncio.to_thread(_until, lambda: admission.worker.queued == 1, "one queued")
        refused = await _post(gw.url, "/v1/messages", MESSAGES)
        refused_chat = await _post(gw.url, "/v1/chat/completions", CHAT)
        metrics = (await asyncio.to_thread(httpx.get, gw.url + "/metrics")).text
        assert len(upstream.requests) == 2  # the refused ones never reached the upstream
        hold.set()
        return await asyncio.gather(*holders, waiting), refused, refused_chat, metrics

    done, refused, refused_chat, metrics = asyncio.run(main())
    assert [r.status_code for r in done] == [200, 200, 200]
    assert all(b"message_stop" in r.content for r in done)
    assert len(upstream.requests) == 3
    # Anthropic's overloaded answer, and OpenAI's.
    assert refused.status_code == 529
    assert refused.json()["error"]["type"] == "overloaded_error"
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["request-id"]
    assert refused_chat.status_code == 503
    assert refused_chat.json()["error"]["code"] == "overloaded"
    assert int(refused_chat.headers["retry-after"]) >= 1
    # Recorded like any other request.
    statuses = sorted((r.status, r.error_type) for r in gw.records)
    assert statuses == [(200, None)] * 3 + [(503, "overloaded_error"), (529, "overloaded_error")]
    assert 'prefixgate_admission_refused_total{channel="",scope="worker"} 2.0' in metrics
    assert 'prefixgate_queued{channel="",scope="worker"} 1.0' in metrics
    assert 'prefixgate_in_flight{channel="",scope="worker"} 2.0' in metrics
    assert (admission.worker.in_flight, admission.worker.queued, admission.worker.waited) == (
        0,
        0,
        1,
    )


def test_a_wait_that_runs_out_is_answered_503_on_openai_routes(gateway, upstream, hold):
    gw = gateway(
        None,
        server={"max_in_flight": 1, "max_queued": 4, "queue_timeout": 0.2},
    )

    async def main():
        holder = asyncio.create_task(_post(gw.url, "/v1/chat/completions", CHAT))
        await asyncio.to_thread(_until, lambda: len(upstream.requests) == 1, "one stream upstream")
        late = await _post(gw.url, "/v1/chat/completions", CHAT)
        hold.set()
        return await holder, late

    first, late = asyncio.run(main())
    assert first.status_code == 200 and b"[DONE]" in first.content
    assert late.status_code == 503
    assert late.json()["error"]["type"] == "server_error"
    assert "retry-after" in late.headers
    assert len(upstream.requests) == 1
    assert sorted(r.status for r in gw.records) == [200, 503]


def test_a_client_that_leaves_the_queue_gives_its_place_back(gateway, upstream, hold):
    gw = gateway(None, server={"max_in_flight": 1, "max_queued": 4})
    worker = gw.gateway.admission.worker

    async def main():
        holder = asyncio.create_task(_post(gw.url, "/v1/chat/completions", CHAT))
        await asyncio.to_thread(_until, lambda: len(upstream.requests) == 1, "one stream upstream")
        leaver = asyncio.create_task(_post(gw.url, "/v1/chat/completions", CHAT))
        await asyncio.to_thread(_until, lambda: worker.queued == 1, "one queued")
        leaver.cancel()  # the client goes away while it waits
        await asyncio.to_thread(_until, lambda: worker.queued == 0, "the queue empty")
        hold.set()
        first = await holder
        again = await _post(gw.url, "/v1/chat/completions", CHAT)
        return first, again

    first, again = asyncio.run(main())
    assert (first.status_code, again.status_code) == (200, 200)
    settled(gw.gateway)
    assert (worker.in_flight, worker.queued) == (0, 0)
    assert sorted(r.status for r in gw.records) == [200, 200, 499]


def test_a_full_channel_spills_over_to_the_next_without_blame(gateway, upstream, hold):
    first = {"name": "a", "base_url": upstream.url, "priority": 1, "max_in_flight": 1}
    second = {"name": "b", "base_url": upstream.url, "priority": 0}
    gw = gateway(channels=[first, second])

    async def main():
        holder = asyncio.create_task(_post(gw.url, "/v1/chat/completions", CHAT))
        await asyncio.to_thread(_until, lambda: len(upstream.requests) == 1, "one stream upstream")
        spilled = asyncio.create_task(_post(gw.url, "/v1/chat/completions", CHAT))
        await asyncio.to_thread(_until, lambda: len(upstream.requests) == 2, "the second upstream")
        hold.set()
        return await holder, await spilled

    a, b = asyncio.run(main())
    assert (a.status_code, b.status_code) == (200, 200)
    by_channel = sorted((r.channel, r.retries) for r in gw.records)
    assert by_channel == [("a", 0), ("b", 0)]
    assert not gw.gateway.router.is_ejected(upstream.url)
    assert gw.gateway.admission.channels["a"].in_flight == 0


# -- the gate alone --------------------------------------------------------------------------
def test_the_gate_hands_freed_slots_to_the_oldest_waiter_and_refuses_past_its_queue():
    async def main():
        gate = Gate("g", limit=1, max_queued=2, timeout=60)
        assert gate.try_take()
        order: list[str] = []

        async def wait(name: str) -> None:
            await gate.take()
            order.append(name)

        first = asyncio.create_task(wait("first"))
        await asyncio.sleep(0)
        second = asyncio.create_task(wait("second"))
        await asyncio.sleep(0)
        assert gate.queued == 2
        with pytest.raises(AtCapacity) as refused:
            await gate.take()
        assert refused.value.retry_after >= 1
        assert not gate.try_take()  # a newcomer never overtakes a waiter
        gate.give()
        await first
        gate.give()
        await second
        gate.give()
        return order, gate

    order, gate = asyncio.run(main())
    assert order == ["first", "second"]
    assert (gate.in_flight, gate.queued, gate.refused, gate.waited) == (0, 0, 1, 2)


def test_a_slot_handed_to_a_waiter_that_was_cancelled_meanwhile_is_passed_on():
    async def main():
        gate = Gate("g", limit=1, max_queued=4, timeout=60)
        assert gate.try_take()
        a = asyncio.create_task(gate.take())
        b = asyncio.create_task(gate.take())
        await asyncio.sleep(0)
        gate.give()  # a gets the slot ...
        a.cancel()  # ... but leaves before it runs again
        await asyncio.gather(a, return_exceptions=True)
        await b  # the slot went on to b
        gate.give()
        return gate

    gate = asyncio.run(main())
    assert (gate.in_flight, gate.queued) == (0, 0)


def test_upstream_connection_caps_follow_admission_and_the_channels_settings(gateway, upstream):
    # The pool in all never binds before the worker's admission cap does; a channel's
    # connections are capped by its max_connections, else its max_in_flight.
    upstream.script = lambda body: Reply(text="Hi")
    gw = gateway({"max_in_flight": 3, "keepalive": 2.5}, server={"max_in_flight": 50})
    r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": False}, timeout=60)
    assert r.status_code == 200
    up = gw.gateway.upstream.http  # the HTTP client under the engines' reading of errors
    assert up._pool.max_connections >= 50
    [(origin, _path)] = [t for k, t in up._targets.items() if k[2] == "main"]
    assert (origin.limit, origin.keepalive) == (3, 2.5)
    gw2 = gateway({"max_in_flight": 3, "max_connections": 7})
    up2 = gw2.gateway.upstream.http
    assert up2._pool is None or up2._pool.max_connections >= 2000
    assert set(up2._limits.values()) == {(7, 4.0)}


def test_while_the_loop_runs_late_new_requests_are_refused_and_then_taken_again(gateway, upstream):
    """The loop-lag shed: a worker whose event loop is held (here by a callback that
    blocks it 0.4 s at a time, as a saturated core would) refuses new requests with its
    protocol's overloaded answer and retry-after, records them and sends nothing
    upstream; once the loop keeps time again, requests are taken."""
    gw = gateway(None, server={"shed_loop_lag": 0.2})
    upstream.script = lambda body: Reply(text="Hi there")
    shed = gw.gateway.admission.shed
    loop = shed._loop
    stop = threading.Event()

    def hog() -> None:
        if not stop.is_set():
            time.sleep(0.4)
            loop.call_later(0.01, hog)

    loop.call_soon_threadsafe(hog)
    try:
        _until(lambda: shed.active, "the shed turned on")
        sent = len(upstream.requests)
        m = httpx.post(gw.url + "/v1/messages", json=MESSAGES, timeout=60)
        c = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=60)
    finally:
        stop.set()
    assert m.status_code == 529 and m.json()["error"]["type"] == "overloaded_error"
    assert c.status_code == 503 and "overloaded" in c.json()["error"]["message"]
    assert int(m.headers["retry-after"]) >= 1 and int(c.headers["retry-after"]) >= 1
    assert len(upstream.requests) == sent  # refused before any upstream work
    assert [r.status for r in gw.records[-2:]] == [529, 503]
    metrics = httpx.get(gw.url + "/metrics").text
    assert "prefixgate_admission_shed_total 2.0" in metrics
    _until(lambda: not shed.active, "the shed turned off")
    ok = httpx.post(gw.url + "/v1/messages", json=MESSAGES, timeout=60)
    assert ok.status_code == 200 and "message_stop" in ok.text
