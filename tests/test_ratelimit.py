"""Rate and concurrency limits, in memory and in the real Redis (127.0.0.1:6379)."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from prefixgate.errors import RateLimited
from prefixgate.ratelimit import Limits, MemoryLimiter, RedisLimiter

REDIS_URL = "redis://127.0.0.1:6379/0"


def _limiters():
    return [pytest.param("memory", id="memory"), pytest.param("redis", id="redis")]


def _make(kind: str):
    if kind == "memory":
        return MemoryLimiter()
    return RedisLimiter(REDIS_URL, prefix=f"prefixgate:test:{secrets.token_hex(4)}:")


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_requests_per_minute(kind):
    async def run():
        lim = _make(kind)
        limits = Limits(rpm=3)
        try:
            for _ in range(3):
                await lim.admit("k", limits)
                await lim.done("k", limits, 0)
            with pytest.raises(RateLimited) as info:
                await lim.admit("k", limits)
            assert info.value.status == 429 and 1 <= info.value.retry_after <= 20
            await lim.admit("other", limits)  # per key
        finally:
            await lim.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_tokens_per_minute(kind):
    async def run():
        lim = _make(kind)
        limits = Limits(tpm=1000)
        try:
            await lim.admit("k", limits)
            await lim.done("k", limits, 1500)  # drives the bucket below zero
            with pytest.raises(RateLimited, match="1000 tokens per minute") as info:
                await lim.admit("k", limits)
            assert info.value.retry_after >= 30  # 500 tokens to refill at 1000/min
        finally:
            await lim.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_concurrency(kind):
    async def run():
        lim = _make(kind)
        limits = Limits(concurrency=2)
        try:
            await lim.admit("k", limits)
            await lim.admit("k", limits)
            with pytest.raises(RateLimited, match="in flight"):
                await lim.admit("k", limits)
            await lim.done("k", limits, 10)
            await lim.admit("k", limits)
        finally:
            await lim.aclose()

    asyncio.run(run())


def test_two_gateways_share_redis_limits():
    async def run():
        prefix = f"prefixgate:test:{secrets.token_hex(4)}:"
        a, b = RedisLimiter(REDIS_URL, prefix=prefix), RedisLimiter(REDIS_URL, prefix=prefix)
        limits = Limits(rpm=4)
        try:
            for lim in (a, b, a, b):
                await lim.admit("k", limits)
            with pytest.raises(RateLimited):
                await b.admit("k", limits)
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(run())
