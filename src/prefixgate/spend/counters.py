"""Where budgets are counted: per counter (one budget of one key or owner in one window) the
units ``spent`` (settled: the sum of the finished requests' real charges) and ``reserved``
(held by requests in flight: their estimates), in memory for one gateway or in Redis for
several. Mirrors :mod:`prefixgate.ratelimit`.

A request takes a hold on every counter that applies to it, at once and only if each has
room (``spent + reserved < limit``): the hold is its estimate. When it ends, each hold is
dropped and its real charge added to ``spent``. So a budget is overshot by at most what
the requests admitted while it still had room charged beyond it, and ``spent`` is exactly
the sum of the charges. A hold a gateway never settled (it died) lapses at ``until``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Line:
    """One counter a request is held against."""

    counter: str  # the counter's key: "key:alice:tokens:day:2025-06-01"
    limit: int
    estimate: int
    ttl: int  # seconds the counter is kept (its window's end, and a week)


class Refused(Exception):
    """The counter ``lines[index]`` has no room: its figures when asked."""

    def __init__(self, index: int, spent: int, reserved: int) -> None:
        super().__init__(index, spent, reserved)
        self.index, self.spent, self.reserved = index, spent, reserved


class _Counter:
    __slots__ = ("spent", "reserved", "holds", "expiry")

    def __init__(self) -> None:
        self.spent = 0
        self.reserved = 0
        self.holds: dict[str, int] = {}
        self.expiry: list[tuple[float, str]] = []  # a heap of (until, hold)

    def lapse(self, now: float) -> None:
        while self.expiry and self.expiry[0][0] <= now:
            _, hold = heapq.heappop(self.expiry)
            self.reserved -= self.holds.pop(hold, 0)


class MemoryCounters:
    """Counters of one gateway process (seeded from the store at start)."""

    def __init__(self) -> None:
        self._counters: dict[str, _Counter] = {}

    def _get(self, name: str) -> _Counter:
        c = self._counters.get(name)
        if c is None:
            c = self._counters[name] = _Counter()
        return c

    async def reserve(
        self, hold: str, lines: list[Line], now: float, until: float
    ) -> list[tuple[int, int]]:
        counters = [self._get(line.counter) for line in lines]
        for i, (c, line) in enumerate(zip(counters, lines, strict=True)):
            c.lapse(now)
            if c.spent + c.reserved >= line.limit:
                raise Refused(i, c.spent, c.reserved)
        for c, line in zip(counters, lines, strict=True):
            c.reserved += line.estimate
            c.holds[hold] = line.estimate
            heapq.heappush(c.expiry, (until, hold))
        return [(c.spent, c.reserved) for c in counters]

    async def settle(self, hold: str, counters: list[str], charges: list[int]) -> None:
        self.settle_now(hold, counters, charges)

    def settle_now(self, hold: str, counters: list[str], charges: list[int]) -> None:
        """:meth:`settle` without a turn of the loop (the keeper calls it in place)."""
        for name, charge in zip(counters, charges, strict=True):
            c = self._get(name)
            c.reserved -= c.holds.pop(hold, 0)
            c.spent += charge
            if len(c.expiry) > 2 * len(c.holds) + 64:  # settled holds left in the heap
                c.expiry = [e for e in c.expiry if e[1] in c.holds]
                heapq.heapify(c.expiry)

    async def read(self, counters: list[str]) -> list[tuple[int, int]]:
        out = []
        for name in counters:
            c = self._counters.get(name)
            out.append((0, 0) if c is None else (c.spent, c.reserved))
        return out

    async def seed(self, counter: str, spent: int, ttl: int) -> None:
        if counter not in self._counters:
            self._get(counter).spent = spent

    async def aclose(self) -> None:
        pass


# KEYS: per line, its hash (spent, reserved, h:<hold> -> estimate) and its expiry zset.
# ARGV: hold, now, until, then per line: limit, estimate, ttl.
# Returns {0, i, spent, reserved} when line i has no room, else {1, spent1, reserved1, …}.
_RESERVE = """
local hold, now, untl = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local n = #KEYS / 2
local seen = {}
for i = 1, n do
  local h, z = KEYS[2 * i - 1], KEYS[2 * i]
  local gone = redis.call('ZRANGEBYSCORE', z, '-inf', now)
  for _, id in ipairs(gone) do
    local est = redis.call('HGET', h, 'h:' .. id)
    if est then
      redis.call('HINCRBY', h, 'reserved', -tonumber(est))
      redis.call('HDEL', h, 'h:' .. id)
    end
  end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', z, '-inf', now) end
  local v = redis.call('HMGET', h, 'spent', 'reserved')
  local spent, reserved = tonumber(v[1] or '0'), tonumber(v[2] or '0')
  if spent + reserved >= tonumber(ARGV[1 + 3 * i]) then
    return {0, i - 1, spent, reserved}
  end
  seen[i] = {spent, reserved}
end
local out = {1}
for i = 1, n do
  local h, z = KEYS[2 * i - 1], KEYS[2 * i]
  local est, ttl = tonumber(ARGV[2 + 3 * i]), tonumber(ARGV[3 + 3 * i])
  redis.call('HINCRBY', h, 'reserved', est)
  redis.call('HSET', h, 'h:' .. hold, est)
  redis.call('ZADD', z, untl, hold)
  redis.call('EXPIRE', h, ttl)
  redis.call('EXPIRE', z, ttl)
  out[#out + 1] = seen[i][1]
  out[#out + 1] = seen[i][2] + est
end
return out
"""

# KEYS: per counter, its hash and expiry zset. ARGV: hold, then per counter its charge.
_SETTLE = """
local hold = ARGV[1]
for i = 1, #KEYS / 2 do
  local h, z = KEYS[2 * i - 1], KEYS[2 * i]
  local est = redis.call('HGET', h, 'h:' .. hold)
  if est then
    redis.call('HINCRBY', h, 'reserved', -tonumber(est))
    redis.call('HDEL', h, 'h:' .. hold)
    redis.call('ZREM', z, hold)
  end
  redis.call('HINCRBY', h, 'spent', tonumber(ARGV[1 + i]))
end
return 1
"""


class RedisCounters:
    """The same counters shared by every gateway on one Redis; each reserve and settle is
    one script, so concurrent gateways never see a half-made hold."""

    def __init__(self, url: str, *, prefix: str = "prefixgate:budget:") -> None:
        import redis.asyncio as redis

        self._redis = redis.from_url(url)
        self._prefix = prefix
        self._reserve = self._redis.register_script(_RESERVE)
        self._settle = self._redis.register_script(_SETTLE)

    def _keys(self, counters: Iterable[str]) -> list[str]:
        keys = []
        for name in counters:
            keys += [self._prefix + name, self._prefix + name + ":exp"]
        return keys

    async def reserve(
        self, hold: str, lines: list[Line], now: float, until: float
    ) -> list[tuple[int, int]]:
        args: list[str | float | int] = [hold, now, until]
        for line in lines:
            args += [line.limit, line.estimate, line.ttl]
        res = await self._reserve(keys=self._keys(line.counter for line in lines), args=args)
        if int(res[0]) == 0:
            raise Refused(int(res[1]), int(res[2]), int(res[3]))
        figures = [int(v) for v in res[1:]]
        return list(zip(figures[0::2], figures[1::2], strict=True))

    async def settle(self, hold: str, counters: list[str], charges: list[int]) -> None:
        await self._settle(keys=self._keys(counters), args=[hold, *charges])

    async def read(self, counters: list[str]) -> list[tuple[int, int]]:
        pipe = self._redis.pipeline(transaction=False)
        for name in counters:
            pipe.hmget(self._prefix + name, "spent", "reserved")
        return [(int(s or 0), int(r or 0)) for s, r in await pipe.execute()]

    async def seed(self, counter: str, spent: int, ttl: int) -> None:
        key = self._prefix + counter
        if await self._redis.hsetnx(key, "spent", spent):
            await self._redis.expire(key, ttl)

    async def aclose(self) -> None:
        await self._redis.aclose()


def make_counters(shared_url: str | None) -> MemoryCounters | RedisCounters:
    return RedisCounters(shared_url) if shared_url else MemoryCounters()


__all__ = ["Line", "MemoryCounters", "RedisCounters", "Refused", "make_counters"]
