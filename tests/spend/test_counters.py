"""The budget counters, in memory and in the real Redis (127.0.0.1:6379): holds, settlement,
refusal, lapsed holds, and many reservations at once."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from prefixgate.spend.counters import Line, MemoryCounters, RedisCounters, Refused

REDIS_URL = "redis://127.0.0.1:6379/0"


def _make(kind: str):
    if kind == "memory":
        return MemoryCounters()
    return RedisCounters(REDIS_URL, prefix=f"prefixgate:test:{secrets.token_hex(4)}:")


def run(kind: str, body) -> None:
    async def main():
        counters = _make(kind)
        try:
            await body(counters)
        finally:
            await counters.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_hold_settle_and_refuse(kind):
    async def body(counters):
        a, b = Line("key:a", 100, 30, 60), Line("owner:t", 1000, 5, 60)
        assert await counters.reserve("r1", [a, b], 0.0, 100.0) == [(0, 30), (0, 5)]
        assert await counters.reserve("r2", [a, b], 0.0, 100.0) == [(0, 60), (0, 10)]
        await counters.settle("r1", ["key:a", "owner:t"], [45, 7])  # real charge above estimate
        assert await counters.read(["key:a", "owner:t"]) == [(45, 30), (7, 5)]
        await counters.reserve("r3", [a, b], 1.0, 100.0)  # 45 + 30 < 100: room
        with pytest.raises(Refused) as info:  # 45 + 60 >= 100
            await counters.reserve("r4", [b, a], 1.0, 100.0)
        assert (info.value.index, info.value.spent, info.value.reserved) == (1, 45, 60)
        # nothing was held on the counter that had room
        assert await counters.read(["owner:t"]) == [(7, 10)]
        await counters.settle("r2", ["key:a", "owner:t"], [0, 0])
        await counters.settle("r3", ["key:a", "owner:t"], [10, 1])
        assert await counters.read(["key:a", "owner:t"]) == [(55, 0), (8, 0)]

    run(kind, body)


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_hold_never_settled_lapses(kind):
    async def body(counters):
        line = Line("key:a", 10, 10, 60)
        await counters.reserve("dead", [line], 0.0, 5.0)  # its gateway died
        with pytest.raises(Refused):
            await counters.reserve("r", [line], 4.0, 9.0)
        await counters.reserve("r", [line], 6.0, 11.0)  # lapsed at 5
        await counters.settle("dead", ["key:a"], [3])  # a late settlement still counts
        assert await counters.read(["key:a"]) == [(3, 10)]

    run(kind, body)


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_seed_sets_only_a_new_counter(kind):
    async def body(counters):
        await counters.seed("key:a", 40, 60)
        await counters.seed("key:a", 99, 60)
        assert await counters.read(["key:a", "key:b"]) == [(40, 0), (0, 0)]

    run(kind, body)


def test_concurrent_holds_in_redis_never_exceed_the_room():
    """Two clients of one Redis reserving at once: exactly as many holds as fit."""

    async def body(counters):
        other = RedisCounters(REDIS_URL, prefix=counters._prefix)
        try:
            line = Line("key:c", 1000, 100, 60)

            async def take(led, i):
                try:
                    await led.reserve(f"h{i}", [line], 0.0, 100.0)
                    return True
                except Refused:
                    return False

            got = await asyncio.gather(*(take((counters, other)[i % 2], i) for i in range(40)))
            assert sum(got) == 10
            assert await counters.read(["key:c"]) == [(0, 1000)]
        finally:
            await other.aclose()

    run("redis", body)
