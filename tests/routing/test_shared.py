"""The shared mode against the real Redis on 127.0.0.1:6379 (fails, never skips, if it is
down): two gateway routers see each other's block sets and in-flight counts."""

from __future__ import annotations

import asyncio
import secrets

import pytest
import redis
import redis.asyncio as aioredis

from prefixgate.config import parse_config
from prefixgate.routing import ChannelRouter

REDIS = "redis://127.0.0.1:6379/0"
URLS = ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1", "http://10.0.0.3:8000/v1"]


@pytest.fixture
def namespace():
    client = redis.Redis.from_url(REDIS, socket_timeout=5)
    client.ping()  # Redis must be up: this raises rather than skipping
    ns = f"prefixgate-test:{secrets.token_hex(6)}"
    try:
        yield ns
    finally:
        for key in client.scan_iter(match=ns + ":*"):
            client.delete(key)
        client.close()


def routers(ns: str, n: int = 2, url: str = REDIS, **routing) -> list[ChannelRouter]:
    ch = {
        "name": "c",
        "base_url": URLS[0],
        "replicas": URLS[1:],
        "routing": {"shared": url, **routing},
    }
    chans = parse_config({"channels": [ch], "store": None}).channels
    return [ChannelRouter(chans, gateway_id=f"gw{i}", shared_namespace=ns) for i in range(n)]


def chat(text: str) -> dict:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": "sys " * 80}, {"role": "user", "content": text}],
    }


def test_a_second_gateway_follows_the_first_ones_blocks(namespace):
    a, b = routers(namespace, policy="prefix")

    async def scenario() -> None:
        try:
            conv = chat("refactor the storage layer " * 30)
            t = (await a.plan("m", "k1", prompt=lambda ch: conv))[0]
            a.acquire(t, "r1")
            assert await a.shared(t.channel).flush()
            longer = chat("refactor the storage layer " * 30 + "and then the tests " * 20)
            for key in ("x", "y", "z"):  # b has never seen this prompt itself
                assert (await b.plan("m", key, prompt=lambda ch: longer))[0].base_url == t.base_url
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(scenario())


def test_in_flight_counts_are_shared_and_die_with_their_gateway(namespace):
    a, b = routers(namespace, policy="least_busy")

    async def scenario() -> None:
        try:
            first = (await a.plan("m", "k"))[0]
            a.acquire(first, "r1")
            a.acquire(first, "r2")
            await a.shared(first.channel).flush()
            order = [t.base_url for t in await b.plan("m", "k")]
            assert order[-1] == first.base_url  # b counts a's two requests
            a.release("r1")
            a.release("r2")
            await a.shared(first.channel).flush()
            assert (await b.plan("m", "k"))[0].base_url == first.base_url
            a.acquire(first, "r3")
            await a.shared(first.channel).flush()
            assert (await b.plan("m", "k"))[-1].base_url == first.base_url
            await a.aclose()  # a gateway that goes away stops counting at once
            assert (await b.plan("m", "k"))[0].base_url == first.base_url
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(scenario())


def test_block_sets_are_trimmed_and_expire(namespace):
    (a,) = routers(namespace, 1, policy="prefix", lru_blocks=8, shared_ttl=60)

    async def scenario() -> None:
        client = aioredis.Redis.from_url(REDIS)
        try:
            conv = chat("a long prompt " * 100)
            t = (await a.plan("m", "k", prompt=lambda ch: conv))[0]
            assert len(t.blocks) > 8
            a.acquire(t, "r")
            shared = a.shared(t.channel)
            await shared.flush()
            key = shared.blocks_key("c", t.base_url)
            assert await client.zcard(key) == 8
            assert 0 < await client.ttl(key) <= 60
            kept = await client.zmscore(key, list(t.blocks.hashes[:8]))
            assert all(s is not None for s in kept)  # the chain's head survives the trim
        finally:
            await client.aclose()
            await a.aclose()

    asyncio.run(scenario())


def test_redis_down_falls_back_to_local_state(namespace):
    (a,) = routers(namespace, 1, url="redis://127.0.0.1:1/0", policy="prefix")

    async def scenario() -> None:
        try:
            conv = chat("work " * 200)
            t = (await a.plan("m", "k", prompt=lambda ch: conv))[0]
            a.acquire(t, "r")
            assert not await a.shared(t.channel).flush()
            assert (await a.plan("m", "other", prompt=lambda ch: conv))[0].base_url == t.base_url
        finally:
            await a.aclose()

    asyncio.run(scenario())
