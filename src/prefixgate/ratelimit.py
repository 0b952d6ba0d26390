"""Per-key rate and concurrency limits: requests per minute, tokens per minute, requests in
flight. In memory for one gateway; in Redis when several gateways share the limits.

Rates are token buckets: a bucket of ``per_minute`` holds at most that many units and
refills at ``per_minute / 60`` units a second. A request needs one unit of the request
bucket and a non-empty token bucket; its prompt and completion tokens are taken from the
token bucket when it ends (which may drive it below zero: the next request waits until it
has refilled). A rejected request is told when to retry.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from prefixgate.errors import RateLimited


@dataclass(frozen=True, slots=True)
class Limits:
    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None

    @property
    def any(self) -> bool:
        return bool(self.rpm or self.tpm or self.concurrency)


class _Bucket:
    __slots__ = ("level", "stamp")

    def __init__(self, level: float) -> None:
        self.level = level
        self.stamp = time.monotonic()

    def refill(self, per_minute: int) -> None:
        now = time.monotonic()
        self.level = min(per_minute, self.level + (now - self.stamp) * per_minute / 60.0)
        self.stamp = now


def _wait(level: float, need: float, per_minute: int) -> float:
    return max(0.0, (need - level) * 60.0 / per_minute)


class MemoryLimiter:
    """Limits for one gateway process."""

    def __init__(self) -> None:
        self._req: dict[str, _Bucket] = {}
        self._tok: dict[str, _Bucket] = {}
        self._inflight: dict[str, int] = {}

    async def admit(self, key: str, limits: Limits) -> None:
        if limits.concurrency and self._inflight.get(key, 0) >= limits.concurrency:
            raise RateLimited(
                f"too many requests in flight for this key (limit {limits.concurrency})",
                retry_after=1,
            )
        if limits.tpm:
            tb = self._tok.setdefault(key, _Bucket(limits.tpm))
            tb.refill(limits.tpm)
            if tb.level <= 0:
                wait = _wait(tb.level, 1, limits.tpm)
                raise RateLimited(
                    f"token rate limit of {limits.tpm} tokens per minute reached",
                    retry_after=math.ceil(wait),
                )
        if limits.rpm:
            rb = self._req.setdefault(key, _Bucket(limits.rpm))
            rb.refill(limits.rpm)
            if rb.level < 1:
                wait = _wait(rb.level, 1, limits.rpm)
                raise RateLimited(
                    f"request rate limit of {limits.rpm} per minute reached",
                    retry_after=math.ceil(wait),
                )
            rb.level -= 1
        if limits.concurrency:
            self._inflight[key] = self._inflight.get(key, 0) + 1

    async def done(self, key: str, limits: Limits, tokens: int) -> None:
        if limits.concurrency:
            n = self._inflight.get(key, 0) - 1
            if n > 0:
                self._inflight[key] = n
            else:
                self._inflight.pop(key, None)
        if limits.tpm and tokens:
            tb = self._tok.setdefault(key, _Bucket(limits.tpm))
            tb.refill(limits.tpm)
            tb.level -= tokens

    async def aclose(self) -> None:
        pass


# KEYS: request bucket, token bucket, in-flight counter.
# ARGV: now (s), rpm, tpm, concurrency (0 = none).
# Returns {0, wait_s, reason} when refused, {1} when admitted.
_ADMIT = """
local now = tonumber(ARGV[1])
local rpm, tpm, conc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local function level(key, per_minute)
  local v = redis.call('HMGET', key, 'level', 'stamp')
  local lvl, stamp = tonumber(v[1]), tonumber(v[2])
  if lvl == nil then return per_minute end
  return math.min(per_minute, lvl + (now - stamp) * per_minute / 60.0)
end
if conc > 0 then
  local n = tonumber(redis.call('GET', KEYS[3]) or '0')
  if n >= conc then return {0, '1', 'concurrency'} end
end
if tpm > 0 then
  local t = level(KEYS[2], tpm)
  if t <= 0 then return {0, tostring((1 - t) * 60.0 / tpm), 'tpm'} end
end
if rpm > 0 then
  local r = level(KEYS[1], rpm)
  if r < 1 then return {0, tostring((1 - r) * 60.0 / rpm), 'rpm'} end
  redis.call('HSET', KEYS[1], 'level', tostring(r - 1), 'stamp', tostring(now))
  redis.call('EXPIRE', KEYS[1], 120)
end
if conc > 0 then
  redis.call('INCR', KEYS[3])
  redis.call('EXPIRE', KEYS[3], 3600)
end
return {1}
"""

# KEYS: token bucket, in-flight counter. ARGV: now, tpm, concurrency, tokens.
_DONE = """
local now, tpm, conc, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if conc > 0 then
  local n = redis.call('DECR', KEYS[2])
  if n <= 0 then redis.call('DEL', KEYS[2]) end
end
if tpm > 0 and tokens > 0 then
  local v = redis.call('HMGET', KEYS[1], 'level', 'stamp')
  local lvl, stamp = tonumber(v[1]), tonumber(v[2])
  if lvl == nil then lvl = tpm else lvl = math.min(tpm, lvl + (now - stamp) * tpm / 60.0) end
  redis.call('HSET', KEYS[1], 'level', tostring(lvl - tokens), 'stamp', tostring(now))
  redis.call('EXPIRE', KEYS[1], 3600)
end
return 1
"""

_MESSAGES = {
    "concurrency": "too many requests in flight for this key (limit {c})",
    "tpm": "token rate limit of {t} tokens per minute reached",
    "rpm": "request rate limit of {r} per minute reached",
}


class RedisLimiter:
    """The same limits shared by every gateway that points at one Redis. Wall-clock time
    (not monotonic) so that gateways on several hosts agree."""

    def __init__(self, url: str, *, prefix: str = "prefixgate:rl:") -> None:
        import redis.asyncio as redis

        self._redis = redis.from_url(url)
        self._prefix = prefix
        self._admit = self._redis.register_script(_ADMIT)
        self._done = self._redis.register_script(_DONE)

    def _keys(self, key: str) -> list[str]:
        p = self._prefix + key
        return [p + ":req", p + ":tok", p + ":inflight"]

    async def admit(self, key: str, limits: Limits) -> None:
        res = await self._admit(
            keys=self._keys(key),
            args=[time.time(), limits.rpm or 0, limits.tpm or 0, limits.concurrency or 0],
        )
        if int(res[0]) == 1:
            return
        wait, reason = float(res[1]), res[2].decode() if isinstance(res[2], bytes) else res[2]
        msg = _MESSAGES[reason].format(c=limits.concurrency, t=limits.tpm, r=limits.rpm)
        raise RateLimited(msg, retry_after=max(1, math.ceil(wait)))

    async def done(self, key: str, limits: Limits, tokens: int) -> None:
        req, tok, inflight = self._keys(key)
        await self._done(
            keys=[tok, inflight],
            args=[time.time(), limits.tpm or 0, limits.concurrency or 0, tokens],
        )

    async def aclose(self) -> None:
        await self._redis.aclose()


def make_limiter(shared_url: str | None):
    return RedisLimiter(shared_url) if shared_url else MemoryLimiter()


__all__ = ["Limits", "MemoryLimiter", "RedisLimiter", "make_limiter"]
