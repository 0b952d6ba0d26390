"""``routing: precise`` end to end: simulated vLLM replicas publishing their KV events over
real sockets, the gateway subscribed to them on loopback, real clients. The replica that
holds the prompt's prefix is chosen; a replica whose events are stale is scored by the
estimate; the record says which."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
from collections.abc import Iterator

import httpx
import openai
import pytest

from prefixgate.config import parse_config
from prefixgate.lab.events.publisher import PublisherSettings
from prefixgate.lab.upstream_sim import SimSettings, start_upstreams_in_thread
from prefixgate.routing.policies import order_session
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from tests.conftest import ListRecorder, settled
from tests.events.streams import wait_until

SYSTEM = "You are a careful coding agent working on a large repository. " * 40


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kv_entry(up) -> dict:
    """The gateway's side of one simulated replica's events (the engine binds)."""
    pub = up.app.state.sim.events
    if pub is None:  # no publisher there: an address nobody publishes on
        return {"endpoint": f"tcp://127.0.0.1:{free_port()}"}
    return {
        "endpoint": "tcp://*:" + pub.endpoint.rsplit(":", 1)[1],
        "replay_endpoint": "tcp://*:" + pub.replay_endpoint.rsplit(":", 1)[1],
    }


@contextlib.contextmanager
def deployment(
    publishing: list[bool], stale_after: float = 30.0, store: str | None = None
) -> Iterator[tuple]:
    """Simulated replicas (those marked publish their KV events) behind a gateway with
    ``routing: precise``; yields (replicas, gateway url, records, hub)."""
    events = PublisherSettings("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "kv")
    ups = []
    try:
        for on in publishing:
            ups += start_upstreams_in_thread(
                SimSettings(block_size=16, kv_events=events if on else None)
            )
        channel = {
            "name": "sim",
            "base_url": ups[0].base_url,
            "replicas": [u.base_url for u in ups[1:]],
            "routing": {"policy": "precise"},
            "kv_events": {
                "replicas": [kv_entry(u) for u in ups],
                "topic": "kv",
                "block_size": 16,
                "stale_after": stale_after,
            },
        }
        rec = ListRecorder()
        config = {"channels": [channel], "store": None if store is None else {"dsn": store}}
        app = create_app(parse_config(config), recorder=rec)
        with ServerThread(app) as gw:
            for u in ups:
                pub = u.app.state.sim.events
                assert pub is None or pub.wait_for_subscribers(1, 30)
            yield ups, gw.url, rec, app.state.events, app.state.gateway
    finally:
        for u in ups:
            u.stop()


def request(user: str) -> dict:
    return {
        "model": "sim-model",
        "max_tokens": 8,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
    }


def applied(hub, up) -> bool:
    pub, st = up.app.state.sim.events, hub.status("sim", up.base_url)
    return pub.next_seq == 0 or st.last_seq == pub.next_seq - 1


async def ask(client, body: dict, session: str):
    return await client.chat.completions.create(**body, extra_headers={"x-session-id": session})


def test_the_replica_holding_the_prefix_is_chosen() -> None:
    with deployment([True, True, True]) as (ups, url, rec, hub, gw):
        urls = [u.base_url for u in ups]
        # the replica the session's hash would pick LAST holds the prefix
        holder = ups[urls.index(order_session(urls, "probe")[-1])]

        async def run():
            async with openai.AsyncOpenAI(base_url=holder.base_url, api_key="x") as direct:
                await direct.chat.completions.create(**request("warm the cache"))
            await wait_until(lambda: applied(hub, holder), "the holder's events applied")
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x") as client:
                return await ask(client, request("a new question"), "probe")

        resp = asyncio.run(run())
        settled(gw)
    (r,) = rec.records
    assert r.replica == holder.base_url and r.route_source == "events"
    assert r.cached_tokens == resp.usage.prompt_tokens_details.cached_tokens > 500


def test_each_session_follows_its_cache() -> None:
    with deployment([True, True]) as (ups, url, rec, hub, gw):

        async def run():
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x") as client:
                for turn in range(3):
                    for s in range(2):
                        body = request(f"session {s} " * 200 + f"turn {turn}")
                        await ask(client, body, f"s{s}")
                        await wait_until(lambda: all(applied(hub, u) for u in ups), "applied")

        asyncio.run(run())
        settled(gw)
    by_session: dict[str, set] = {}
    for r in rec.records:
        assert r.status == 200 and r.route_source == "events"
        by_session.setdefault(r.session_id, set()).add(r.replica)
    assert all(len(replicas) == 1 for replicas in by_session.values())
    later = [r for r in rec.records if r.request_id != rec.records[0].request_id]
    assert all(r.cached_tokens > 0 for r in later)


@pytest.mark.parametrize(
    ("publishing", "source"),
    [([True, False], "events+estimate"), ([False, False], "estimate")],
)
def test_stale_events_fall_back_to_the_estimate_and_the_record_says_so(publishing, source):
    with deployment(publishing, stale_after=0.2) as (ups, url, rec, hub, gw):
        silent = [u for u, on in zip(ups, publishing, strict=True) if not on]

        async def run():
            await wait_until(
                lambda: not any(hub.usable("sim", u.base_url) for u in silent), "stale"
            )
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x") as client:
                for turn in range(3):
                    await ask(client, request(f"the same session, turn {turn}"), "one")

        asyncio.run(run())
        settled(gw)
        statuses = {s["replica"]: s for s in hub.statuses()}
    assert [r.route_source for r in rec.records] == [source] * 3
    assert len({r.replica for r in rec.records}) == 1  # the estimate kept the session
    assert all(statuses[u.base_url]["stale"] for u in silent)
    assert all(r.cached_tokens > 0 for r in rec.records[1:])


def test_the_event_streams_on_healthz_metrics_and_the_dashboard(tmp_path) -> None:
    dsn = f"sqlite:///{tmp_path}/records.db"
    with open_store(dsn) as store:
        store.migrate()
    with deployment([True, False], stale_after=0.2, store=dsn) as (ups, url, rec, hub, gw):
        live, silent = ups

        async def run():
            await wait_until(lambda: not hub.usable("sim", silent.base_url), "stale")
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x") as client:
                await ask(client, request("hello"), "one")
            await wait_until(lambda: applied(hub, live), "applied")

        asyncio.run(run())
        settled(gw)
        assert httpx.get(url + "/healthz").json() == {"status": "ok"}
        details = httpx.get(url + "/healthz?details=1").json()["details"]["kv_events"]
        metrics = httpx.get(url + "/metrics").text
        upstream = httpx.get(url + "/dashboard/api/upstream").json()
    by_url = {d["replica"]: d for d in details}
    assert by_url[live.base_url]["connected"] and not by_url[live.base_url]["stale"]
    assert by_url[silent.base_url]["stale"] and not by_url[silent.base_url]["connected"]
    assert (by_url[live.base_url]["connects"], by_url[silent.base_url]["connects"]) == (1, 0)
    blocks = by_url[live.base_url]["blocks"]
    if rec.records[0].replica == live.base_url:
        assert blocks["GPU"] > 0
    labels = f'channel="sim",replica="{live.base_url}"'
    assert f"prefixgate_kv_events_connected{{{labels}}} 1.0" in metrics
    assert f"prefixgate_kv_events_batches_total{{{labels}}}" in metrics
    assert f"prefixgate_kv_events_connects_total{{{labels}}} 1.0" in metrics
    since = f"prefixgate_kv_events_connection_since_timestamp_seconds{{{labels}}} "
    (value,) = [line[len(since) :] for line in metrics.splitlines() if line.startswith(since)]
    assert float(value) == by_url[live.base_url]["connection_since"]
    stale = f'prefixgate_kv_events_stale{{channel="sim",replica="{silent.base_url}"}} 1.0'
    assert stale in metrics
    assert 'prefixgate_route_source_total{channel="sim",source="events+estimate"} 1.0' in metrics
    (ch,) = upstream["channels"]
    assert ch["kv_events"] and ch["routing"] == "precise"
    shown = {r["url"]: r["events"] for r in ch["replicas"]}
    assert shown[live.base_url]["connected"] and shown[silent.base_url]["stale"]
    assert shown[live.base_url]["connects"] == 1


def test_healthz_details_need_the_admin_key() -> None:
    digest = hashlib.sha256(b"admin-secret").hexdigest()
    config = parse_config(
        {
            "channels": [{"name": "c", "base_url": "http://127.0.0.1:9/v1"}],
            "store": None,
            "admin_key_sha256": digest,
        }  # fmt: skip
    )
    with ServerThread(create_app(config, recorder=ListRecorder())) as gw:
        assert httpx.get(gw.url + "/healthz").json() == {"status": "ok"}
        assert httpx.get(gw.url + "/healthz?details").status_code == 401
        r = httpx.get(gw.url + "/healthz?details", headers={"x-api-key": "admin-secret"})
    # no upstream listening: its template's rendering is not known, and said so
    rendering = {
        "channel": "c",
        "tools": "tools_first",
        "system": "unknown",
        "reasoning": "unknown",
        "source": "assumed (not learned from the upstream yet)",
        "system_in_place": False,
    }
    details = r.json()["details"]
    assert details["kv_events"] == [] and details["rendering"] == [rendering]
    assert details["config"]["generation"] == 1 and details["config"]["last_reload"] is None


def test_precise_needs_kv_events() -> None:
    with pytest.raises(Exception, match="precise needs kv_events"):
        parse_config(
            {
                "channels": [
                    {"name": "c", "base_url": "http://x/v1", "routing": {"policy": "precise"}}
                ]
            }
        )
