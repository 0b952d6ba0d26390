"""Optional shared routing state in Redis (``routing: {shared: redis://host:6379/0}``).

Without it each gateway replica estimates the upstream caches from its own traffic only.
With it, gateway replicas share two things:

- **Block sets**: one sorted set per upstream replica, ``{ns}:blocks:{channel}:{url}``,
  member = a 16-byte block hash, score = when it was last sent there (the earlier blocks
  of a prompt score slightly higher, so trimming drops a chain's tail first). Trimmed to
  ``routing.lru_blocks`` members (LRU) and expiring ``routing.shared_ttl`` seconds after
  the last write.
- **In-flight counts**: one hash ``{ns}:inflight`` with a field ``"{gateway} {url}"`` per
  gateway and upstream replica, holding that gateway's ABSOLUTE count (never increments, so
  nothing drifts), and ``{ns}:gateways`` with each gateway's heartbeat; counts of a gateway
  whose heartbeat is older than ``stale_after`` are ignored (a crashed gateway's requests
  stop counting on their own).

Writes are queued locally and sent in one pipeline, either ahead of the next read (the
read of a request's routing decision) or by a background writer (releases, heartbeats).
Every read is one round trip. Redis being down never fails a request: the router falls
back to its local state, and Redis is left alone for ``retry_after`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger("prefixgate.routing")

__all__ = ["SharedState", "SharedView"]

_RANK_SLOTS = 16384  # per-request position slots inside one score tick


@dataclass(slots=True)
class SharedView:
    """What Redis knows: matched leading blocks and in-flight counts of OTHER gateways."""

    matched: dict[str, int]
    inflight: dict[str, int]


class SharedState:
    def __init__(
        self,
        url: str,
        *,
        ttl: float = 3600.0,
        namespace: str = "prefixgate:routing",
        gateway_id: str | None = None,
        stale_after: float = 15.0,
        heartbeat_every: float = 5.0,
        timeout: float = 0.5,
        retry_after: float = 5.0,
    ) -> None:
        try:
            import redis.asyncio as aioredis
        except ImportError as exc:  # an optional dependency
            raise RuntimeError("routing.shared needs the redis package: pip install redis") from exc
        self.url = url
        self.ttl = max(1, int(ttl))
        self.ns = namespace
        self.gateway_id = gateway_id or uuid.uuid4().hex[:12]
        self.stale_after = stale_after
        self.heartbeat_every = heartbeat_every
        self.retry_after = retry_after
        self._redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self._blocks: list[tuple[str, Sequence[bytes], int]] = []  # (key, hashes, max)
        self._counts: dict[str, int] = {}  # url -> this gateway's count, not yet written
        self._forget: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._down_until = 0.0
        self._warned_at = -1e9
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:  # the URL may carry a password
        return f"SharedState(gateway_id={self.gateway_id!r})"

    # -- keys --------------------------------------------------------------------------
    def blocks_key(self, channel: str, url: str) -> str:
        return f"{self.ns}:blocks:{channel}:{url}"

    @property
    def inflight_key(self) -> str:
        return f"{self.ns}:inflight"

    @property
    def gateways_key(self) -> str:
        return f"{self.ns}:gateways"

    # -- queued writes -----------------------------------------------------------------
    def add_blocks(self, channel: str, url: str, hashes: Sequence[bytes], max_blocks: int) -> None:
        if hashes:
            self._blocks.append((self.blocks_key(channel, url), hashes, max_blocks))
            self._wake.set()

    def set_inflight(self, url: str, count: int) -> None:
        self._counts[url] = count
        self._wake.set()

    def forget(self, channel: str, url: str) -> None:
        """Drop a replica's block set (it restarted: its cache is empty)."""
        self._forget.add(self.blocks_key(channel, url))
        self._wake.set()

    def _queue_writes(self, pipe) -> None:
        now = time.time()
        tick = int(now * 10) * _RANK_SLOTS
        for key in self._forget:
            pipe.delete(key)
        for key, hashes, max_blocks in self._blocks:
            n = len(hashes)
            pipe.zadd(key, {h: tick + min(n - i, _RANK_SLOTS - 1) for i, h in enumerate(hashes)})
            pipe.zremrangebyrank(key, 0, -(max_blocks + 1))
            pipe.expire(key, self.ttl)
        fields = {f"{self.gateway_id} {url}": c for url, c in self._counts.items()}
        if fields:
            pipe.hset(self.inflight_key, mapping=fields)
            pipe.expire(self.inflight_key, self.ttl)
        pipe.hset(self.gateways_key, self.gateway_id, now)
        pipe.expire(self.gateways_key, self.ttl)
        self._forget, self._blocks, self._counts = set(), [], {}

    def _available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, exc: BaseException) -> None:
        self._down_until = time.monotonic() + self.retry_after
        now = time.monotonic()
        if now - self._warned_at > 30.0:
            self._warned_at = now
            log.warning("routing: shared state unavailable (%s); using local state", exc)

    async def flush(self) -> bool:
        """Send the queued writes (and a heartbeat) now. False if Redis failed."""
        if not self._available():
            return False
        async with self._lock:
            pipe = self._redis.pipeline(transaction=False)
            self._queue_writes(pipe)
            try:
                await pipe.execute()
            except Exception as exc:
                self._failed(exc)
                return False
        return True

    # -- reads -------------------------------------------------------------------------
    async def view(
        self, channel: str, urls: Sequence[str], hashes: Sequence[bytes]
    ) -> SharedView | None:
        """Queued writes, then one read: leading matched blocks per replica and in-flight
        counts of the live other gateways. ``None`` when Redis is unavailable."""
        if not self._available():
            return None
        async with self._lock:
            pipe = self._redis.pipeline(transaction=False)
            self._queue_writes(pipe)
            n_writes = len(pipe)
            if hashes:
                for url in urls:
                    pipe.zmscore(self.blocks_key(channel, url), list(hashes))
            pipe.hgetall(self.inflight_key)
            pipe.hgetall(self.gateways_key)
            try:
                results = (await pipe.execute())[n_writes:]
            except Exception as exc:
                self._failed(exc)
                return None
        matched: dict[str, int] = {}
        if hashes:
            for url, scores in zip(urls, results, strict=False):
                n = 0
                for s in scores:
                    if s is None:
                        break
                    n += 1
                matched[url] = n
        counts, beats = results[-2], results[-1]
        return SharedView(matched, self._others(counts, beats, set(urls)))

    def _others(self, counts: dict, beats: dict, urls: set[str]) -> dict[str, int]:
        now = time.time()
        live = {
            g.decode()
            for g, t in beats.items()
            if now - float(t) <= self.stale_after and g.decode() != self.gateway_id
        }
        out: dict[str, int] = {}
        for field, value in counts.items():
            gw, _, url = field.decode().partition(" ")
            if gw in live and url in urls:
                out[url] = out.get(url, 0) + max(0, int(value))
        return out

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._writer(), name="prefixgate-routing-shared")

    async def _writer(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.heartbeat_every)
            self._wake.clear()
            await self.flush()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._available():
            # This gateway's requests stop counting at once.
            with contextlib.suppress(Exception):
                pipe = self._redis.pipeline(transaction=False)
                pipe.hdel(self.gateways_key, self.gateway_id)
                await pipe.execute()
        await self._redis.aclose()
