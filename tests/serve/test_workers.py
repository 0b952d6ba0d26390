"""``prefixgate serve --workers 2``, real processes on one port, over HTTP on loopback:
every answered stream has exactly one record whichever worker took it (SQLite and
Postgres), the admission cap holds per worker and its refusals are recorded, and prefix
routing shared through Redis follows a prompt from one worker to the other.

Which worker answered: each worker's ``/metrics`` names its process
(``prefixgate_worker_info{pid}``), so scraping on new connections until both have answered
gives each worker's own counters. The kernel spreads connections over the workers by a
hash of each connection's addresses: with tens of connections both get some (all on one
worker has a chance of 2⁻²³ or less here)."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time

import anthropic
import httpx
import openai
import pytest
import redis

from prefixgate.store import open_store
from tests.conftest import scripted_upstream
from tests.fakes import Reply
from tests.serve.served import Served
from tests.test_metrics import samples

REDIS = "redis://127.0.0.1:6379/0"


def config(upstream_url: str, dsn: str, tmp_path, **top) -> dict:
    return {
        "embedded_upstream": False,
        "channels": [{"name": "main", "base_url": upstream_url}],
        "store": {"dsn": dsn, "journal_path": str(tmp_path / "journal")},
        **top,
    }


def by_worker(url: str, until=lambda scrapes: True, workers: int = 2) -> dict[str, str]:
    """The latest ``/metrics`` of each worker, keyed by its pid: scraped on a new connection
    each time until every worker has answered and ``until(scrapes)`` holds."""
    seen: dict[str, str] = {}
    deadline = time.monotonic() + 60  # a guard against a hang, not a measurement
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", headers={"connection": "close"}).text
        ((labels, _),) = samples(text, "prefixgate_worker_info").items()
        seen[dict(labels)["pid"]] = text
        if len(seen) == workers and until(seen):
            return seen
    raise AssertionError(f"workers seen: {sorted(seen)}; until() never held")


def total(text: str, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for k, v in samples(text, name).items() if want <= set(k))


def answered(scrapes: dict[str, str]) -> float:
    return sum(total(t, "prefixgate_requests_total") for t in scrapes.values())


# -- records -------------------------------------------------------------------------------
async def sdk_streams(url: str, n: int) -> list[str]:
    """``n`` concurrent streams, half through the Anthropic SDK, half through OpenAI's; the
    request id each answer named."""
    a = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0)
    o = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)

    async def one(i: int) -> str:
        text = ""
        if i % 2:
            stream = await a.messages.create(
                model="m",
                max_tokens=16,
                stream=True,
                messages=[{"role": "user", "content": f"task {i}"}],
            )
            async for event in stream:
                if event.type == "content_block_delta":
                    text += event.delta.text
            rid = stream.response.headers["request-id"]
        else:
            stream = await o.chat.completions.create(
                model="m",
                stream=True,
                stream_options={"include_usage": True},
                messages=[{"role": "user", "content": f"task {i}"}],
            )
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
            rid = stream.response.headers["x-request-id"]
        assert text == "one two three four five"
        return rid

    try:
        return await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await a.close()
        await o.close()


def test_every_stream_through_two_workers_has_exactly_one_record(upstream, tmp_path, store_dsn):
    dsn = store_dsn
    upstream.script = lambda b: Reply(text="one two three four five", chunk_delay=0.01)
    n = 40
    with Served(tmp_path, config(upstream.url, dsn, tmp_path), "--workers", "2") as gw:
        ids = asyncio.run(sdk_streams(gw.url, n))
        scrapes = by_worker(gw.url, until=lambda s: answered(s) == n)
    assert gw.returncode == 0, gw.output
    served = {pid: total(text, "prefixgate_requests_total") for pid, text in scrapes.items()}
    assert all(served.values()), served  # both workers relayed streams
    with open_store(dsn) as store:
        recs = list(store.iter_records())
    assert sorted(r.request_id for r in recs) == sorted(ids)
    assert all(r.status == 200 and r.stream for r in recs)
    assert sorted(r.endpoint for r in recs) == ["chat"] * (n // 2) + ["messages"] * (n // 2)
    assert not (tmp_path / "journal").exists()  # both workers' slots stored and removed


# -- admission -----------------------------------------------------------------------------
def test_the_admission_cap_holds_per_worker_and_its_refusals_are_recorded(upstream, tmp_path):
    """``server.max_in_flight: 1`` with no queue and two workers: one stream is admitted
    per worker, every other request is refused at once, before any upstream work, with
    ``retry-after`` in its protocol's shape, and recorded."""
    dsn = f"sqlite:///{tmp_path / 'r.db'}"
    hold = threading.Event()
    upstream.script = lambda b: Reply(text="a b c", hold=hold)
    server = {"max_in_flight": 1, "max_queued": 0}
    k = 24
    heads: list[httpx.Response] = []
    bodies: dict[str, bytes] = {}

    async def one(client: httpx.AsyncClient, i: int) -> None:
        messages = [{"role": "user", "content": f"task {i}"}]
        path, body = "/v1/chat/completions", {"model": "m", "stream": True, "messages": messages}
        if i % 2:
            path, body = "/v1/messages", {**body, "max_tokens": 16}
        async with client.stream("POST", gw.url + path, json=body) as r:
            heads.append(r)
            bodies[path + str(i)] = await r.aread()  # an admitted stream: once released

    async def load() -> dict[str, str]:
        async with httpx.AsyncClient(timeout=60) as client:
            tasks = [asyncio.create_task(one(client, i)) for i in range(k)]
            deadline = time.monotonic() + 60  # a guard against a hang
            while len(heads) < k and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            scrapes = await asyncio.to_thread(by_worker, gw.url)
            hold.set()
            await asyncio.gather(*tasks)
        return scrapes

    with Served(
        tmp_path, config(upstream.url, dsn, tmp_path, server=server), "--workers", "2"
    ) as gw:
        scrapes = asyncio.run(load())
    assert gw.returncode == 0, gw.output

    admitted = [r for r in heads if r.status_code == 200]
    refused = [r for r in heads if r.status_code != 200]
    assert len(admitted) == 2 and len(upstream.requests) == 2  # one a worker
    ends = [b"[DONE]", b"message_stop"]
    assert (
        sorted(any(e in b for e in ends) for b in bodies.values()) == [False] * (k - 2) + [True] * 2
    )
    for text in scrapes.values():  # each worker: its own cap, full, and its own refusals
        assert total(text, "prefixgate_in_flight_limit", scope="worker") == 1
        assert total(text, "prefixgate_in_flight", scope="worker") == 1
    refusals = [
        total(t, "prefixgate_admission_refused_total", scope="worker") for t in scrapes.values()
    ]
    assert sum(refusals) == k - 2
    for r in refused:
        assert "retry-after" in r.headers
        if r.request.url.path == "/v1/messages":
            assert r.status_code == 529
            assert r.json()["error"]["type"] == "overloaded_error"
        else:
            assert r.status_code == 503
            assert r.json()["error"]["type"] == "server_error"

    with open_store(dsn) as store:
        recs = {r.request_id: r for r in store.iter_records()}
    assert len(recs) == k
    for r in heads:
        rid = r.headers["request-id" if r.request.url.path == "/v1/messages" else "x-request-id"]
        rec = recs[rid]
        assert rec.status == r.status_code
        assert rec.error_type == (None if r.status_code == 200 else "overloaded_error")


# -- routing -------------------------------------------------------------------------------
@pytest.fixture
def second_upstream():
    with scripted_upstream() as fake:
        yield fake


@pytest.fixture
def shared_channel(upstream, second_upstream):
    """A channel of two replicas with ``prefix`` routing shared through the real Redis
    (fails, never skips, when Redis is down); its keys are removed afterwards."""
    client = redis.Redis.from_url(REDIS, socket_timeout=5)
    client.ping()
    name = f"workers-{secrets.token_hex(4)}"
    urls = [upstream.url, second_upstream.url]
    try:
        yield {
            "name": name,
            "base_url": urls[0],
            "replicas": urls[1:],
            "routing": {"policy": "prefix", "shared": REDIS},
        }
    finally:
        for key in client.scan_iter(match=f"prefixgate:routing:blocks:{name}:*"):
            client.delete(key)
        for field in client.hkeys("prefixgate:routing:inflight"):
            if field.decode().partition(" ")[2] in urls:
                client.hdel("prefixgate:routing:inflight", field)
        client.close()


def test_shared_prefix_routing_follows_a_prompt_across_workers(
    upstream, second_upstream, shared_channel, tmp_path
):
    """A long shared prompt first served by one worker: every later request carrying it,
    each with a session of its own (whose rendezvous alone would pick either replica) and
    each on a new connection, goes to the same replica, whichever worker takes it."""
    system = "You are the build agent of a large monorepo. " * 80
    cfg = {"embedded_upstream": False, "channels": [shared_channel], "store": None}
    n = 24

    def ask(url: str, i: int) -> None:
        body = {
            "model": "m",
            "user": f"session-{i}",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"question {i}"},
            ],
        }
        r = httpx.post(url + "/v1/chat/completions", json=body, headers={"connection": "close"})
        assert r.status_code == 200, r.text

    with Served(tmp_path, cfg, "--workers", "2") as gw:
        ask(gw.url, 0)
        first = upstream if upstream.requests else second_upstream
        for i in range(1, n + 1):
            ask(gw.url, i)
        scrapes = by_worker(gw.url, until=lambda s: answered(s) == n + 1)
    assert gw.returncode == 0, gw.output
    other = second_upstream if first is upstream else upstream
    assert len(first.requests) == n + 1 and not other.requests
    served = {pid: total(text, "prefixgate_requests_total") for pid, text in scrapes.items()}
    assert all(served.values()), served  # both workers routed some of them
