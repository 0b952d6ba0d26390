"""The simulated upstream publishes its prefix cache as an engine does: the real simulated
upstream over HTTP, its events over real sockets into the gateway's hub, and the hub's
prediction of each request's ``cached_tokens`` against what the upstream then reports; and
the hub knowing when the engine's publisher is connected."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import openai
import pytest

from prefixgate.config import parse_config
from prefixgate.events import EngineEvents
from prefixgate.lab.events.publisher import PublisherSettings
from prefixgate.lab.upstream_sim import (
    SimSettings,
    running_upstreams,
    settings_from_options,
    start_upstreams_in_thread,
)

from .streams import free_port, wait_until

B = 16


def session_turns(n_sessions: int, turns: int):
    """(session, messages) of agent sessions sharing a system prompt and tools, in the
    order a busy gateway interleaves them."""
    system = "You are a careful coding agent. " * 40
    histories = {
        s: [{"role": "system", "content": system + f"Workspace {s}: " + "src/x.py " * (10 + s)}]
        for s in range(n_sessions)
    }
    for t in range(turns):
        for s in range(n_sessions):
            histories[s].append({"role": "user", "content": f"turn {t}: fix bug {s}-{t}. " * 6})
            yield s, list(histories[s])
            histories[s].append({"role": "assistant", "content": f"Fixed {s}-{t}. " * (3 + t)})


async def run_sessions(ups, encoding: str, stream: bool) -> list[tuple[int, int, int]]:
    channel = {
        "name": "sim",
        "base_url": ups[0].base_url,
        "replicas": [u.base_url for u in ups[1:]],
        "kv_events": {
            "replicas": [
                {
                    "endpoint": "tcp://*:" + u.app.state.sim.events.endpoint.rsplit(":", 1)[1],
                    "replay_endpoint": "tcp://*:"
                    + u.app.state.sim.events.replay_endpoint.rsplit(":", 1)[1],
                }
                for u in ups
            ],
            "topic": "kv",
        },
    }
    hub = EngineEvents.from_config(parse_config({"channels": [channel]}))
    rows = []
    await hub.start()
    try:
        await hub.wait_ready()
        for u in ups:
            assert await asyncio.to_thread(u.app.state.sim.events.wait_for_subscribers, 1, 30)
        async with contextlib.AsyncExitStack() as stack:
            http = await stack.enter_async_context(httpx.AsyncClient(timeout=60))
            clients = [
                await stack.enter_async_context(
                    openai.AsyncOpenAI(base_url=u.base_url, api_key="none")
                )
                for u in ups
            ]
            for s, messages in session_turns(4, 5):
                r = s % len(ups)  # a session stays on its replica
                up = ups[r]
                tok = (await http.post(up.url + "/tokenize", json={"messages": messages})).json()
                keys = hub.content_keys("sim", tok["tokens"])
                hit = hub.longest_prefix("sim", up.base_url, keys)
                predicted = min(hit.gpu if hit else 0, (tok["count"] - 1) // B) * B
                cached = await ask(clients[r], messages, stream)
                rows.append((predicted, cached, tok["count"]))
                await applied(hub, up)
        for u in ups:  # what the index holds is what each upstream's cache holds
            held = hub.channels["sim"].index.replica(u.base_url).resident()
            assert held == u.cache.pool.copies()
    finally:
        await hub.aclose()
    return rows


async def applied(hub: EngineEvents, up) -> None:
    """Until the hub applied every batch the upstream published."""
    pub, st = up.app.state.sim.events, hub.status("sim", up.base_url)
    await wait_until(lambda: st.last_seq == pub.next_seq - 1, "the events applied")


def cached_of(usage) -> int:
    """The simulated vLLM leaves ``prompt_tokens_details`` out when nothing hit."""
    details = usage.prompt_tokens_details
    return 0 if details is None else details.cached_tokens or 0


async def ask(client: openai.AsyncOpenAI, messages: list[dict], stream: bool) -> int:
    if not stream:
        resp = await client.chat.completions.create(
            model="sim-model", messages=messages, max_tokens=40
        )
        return cached_of(resp.usage)
    chunks = await client.chat.completions.create(
        model="sim-model",
        messages=messages,
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
    )
    cached = None
    async for chunk in chunks:
        if chunk.usage is not None:
            cached = cached_of(chunk.usage)
    assert cached is not None
    return cached


@pytest.mark.parametrize(
    ("encoding", "stream"), [("map", False), ("array", True), ("map-batch", False)]
)
def test_events_predict_the_cached_tokens_of_every_turn(encoding, stream) -> None:
    settings = SimSettings(
        block_size=B,
        capacity_tokens=48 * B,  # two sessions per replica do not fit: they evict each other
        kv_events=PublisherSettings("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "kv", encoding),
    )
    with running_upstreams(settings, replicas=2) as ups:
        rows = asyncio.run(run_sessions(ups, encoding, stream))
        evicted = sum(u.cache.evicted_blocks for u in ups)
    assert [p for p, _, _ in rows] == [c for _, c, _ in rows]
    assert any(c > 0 for _, c, _ in rows) and evicted > 0


def test_the_cli_option_takes_vllms_kv_events_config() -> None:
    s = settings_from_options(
        kv_events_config='{"enable_kv_cache_events": true, "publisher": "zmq", '
        '"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:6557", "topic": "kv",'
        ' "buffer_steps": 100, "encoding": "array"}'
    )
    assert s.kv_events == PublisherSettings("tcp://*:5557", "tcp://*:6557", "kv", "array", 100)
    second = s.for_replica(1).kv_events
    assert (second.endpoint, second.replay_endpoint) == ("tcp://*:5558", "tcp://*:6558")
    for bad in (
        '{"endpoint": "udp://x:1"}',
        "not json",
        '{"encoding": "yaml"}',
        '{"publisher": "null"}',
        '{"endpoint": "tcp://*:1", "colour": "red"}',
    ):
        with pytest.raises(ValueError):
            settings_from_options(kv_events_config=bad)


def test_the_hub_knows_when_the_engines_publisher_connects() -> None:
    """vLLM's way (tests/real): the engine's PUB socket connects to an address the hub
    binds, retrying until it is bound. A publisher counts once its ZeroMQ handshake is done
    (a bare TCP connection, a port probe, does not, nor does the probe's leaving); its
    connections are counted; once ``wait_publishers`` returns, what the engine publishes
    reaches the index with no further wait; a restarted engine connects again."""
    port, replay = free_port(), free_port()
    settings = SimSettings(
        block_size=B,
        kv_events=PublisherSettings(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}", "kv"),
    )
    (up,) = start_upstreams_in_thread(settings)  # its publisher retries: nobody listens yet
    try:
        asyncio.run(_publisher_comes_and_goes(up, settings, port, replay))
    finally:
        up.stop()


async def _publisher_comes_and_goes(up, settings: SimSettings, port: int, replay: int) -> None:
    channel = {
        "name": "sim",
        "base_url": up.base_url,
        "kv_events": {
            "endpoint": f"tcp://127.0.0.1:{port}",
            "replay_endpoint": f"tcp://127.0.0.1:{replay}",
            "topic": "kv",
            "block_size": B,
        },
    }
    hub = EngineEvents.from_config(parse_config({"channels": [channel]}))
    started = time.time()
    await hub.start()
    try:
        await hub.wait_ready()
        _, probe = await asyncio.open_connection("127.0.0.1", port)  # TCP only, no ZeroMQ
        await hub.wait_publishers(30)
        st = hub.status("sim", up.base_url)
        (row,) = hub.statuses()
        assert row["mode"] == "bind" and row["connected"]
        assert (row["publishers"], row["connects"], row["handshake_failures"]) == (1, 1, 0)
        assert started <= row["connection_since"] <= time.time()
        probe.close()
        await wait_until(lambda: st.handshake_failures == 1, "the probe's close seen")
        assert st.connected and st.publishers == 1  # the probe's leaving is not the engine's

        # no wait for the engine's side: the subscription went out with the handshake
        async with openai.AsyncOpenAI(base_url=up.base_url, api_key="none") as client:
            await client.chat.completions.create(
                model="sim-model", messages=[{"role": "user", "content": "hi " * 80}]
            )
        await applied(hub, up)
        assert st.gaps == 0  # live, not replayed
        held = hub.channels["sim"].index.replica(up.base_url).resident()
        assert held and held == up.cache.pool.copies()

        up.stop()  # the engine goes away, its publisher with it
        await wait_until(lambda: not st.connected, "the publisher gone")
        (down,) = hub.statuses()
        assert (down["connected"], down["publishers"], down["connects"]) == (False, 0, 1)
        assert row["connection_since"] <= down["connection_since"] <= time.time()

        (again,) = start_upstreams_in_thread(settings)  # restarted: connects again
        try:
            await hub.wait_publishers(30)
            (back,) = hub.statuses()
            assert (back["connected"], back["publishers"], back["connects"]) == (True, 1, 2)
            assert down["connection_since"] <= back["connection_since"]
        finally:
            again.stop()
    finally:
        await hub.aclose()
