"""Which channel, and which replica of it, serves a request; in failover order.

Channels serving the model are tried by priority (highest first). Within one priority the
order is weighted rendezvous hashing on the request's affinity key (its session). Within a
channel the replicas are ordered by the channel's ``routing.policy`` (``policies.py``):
``session`` (the default), ``round_robin``, ``least_busy``, ``prefix`` or ``precise``.
Requests without a key draw a random one.

``precise`` scores each replica by the prefix its engine reports holding (the KV events'
index, :mod:`prefixgate.events`; the prompt's content keys from
:mod:`prefixgate.events.tokens`, cached per session); a replica whose events are stale or
absent is scored by the ``prefix`` estimate instead (an LRU fed with the same keys), and
the target says which (``Target.source``: ``events``, ``estimate``, ``events+estimate``),
which the record keeps as ``route_source``.

Health: a replica that failed is ejected for a cool-down (passive); a replica whose health
probe fails is down until a probe succeeds (active, ``health.py``). Unhealthy replicas are
not chosen; they stay at the end of the failover order as a last resort.

State kept here, per gateway process: in-flight requests per replica (``acquire`` /
``release`` around each upstream call, held until the response is finished), a
round-robin counter per channel, and for ``prefix`` channels an LRU of block hashes per
replica. With ``routing.shared`` the block sets and in-flight counts are also shared
through Redis (``shared.py``).
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prefixgate.config import ChannelConfig
from prefixgate.engine.order import RenderOrders
from prefixgate.logthrottle import LogThrottle

from .health import HealthChecker

if TYPE_CHECKING:
    from prefixgate.events.hub import EngineEvents
    from prefixgate.events.tokens import EngineTokens
    from prefixgate.upstream.transport import Transport
from .policies import (
    Balance,
    Replica,
    order_least_busy,
    order_prefix,
    order_round_robin,
    order_session,
    precise_score,
    rendezvous,
)
from .prefix import BlockLRU, PromptBlocks, prompt_blocks
from .shared import SharedState

__all__ = ["ChannelRouter", "PromptOf", "Target"]

# The OpenAI chat request (messages, tools) a channel would receive; for ``prefix``.
PromptOf = Callable[[ChannelConfig], dict]

log = logging.getLogger("prefixgate")


@dataclass(frozen=True, slots=True)
class Target:
    channel: ChannelConfig
    base_url: str
    blocks: PromptBlocks | None = field(default=None, compare=False, repr=False)
    # Where the policy's knowledge of the replicas' caches came from (the record's
    # route_source): "events", "estimate", "events+estimate"; None for policies without.
    source: str | None = field(default=None, compare=False)

    @property
    def name(self) -> str:
        return self.channel.name


def _score(key: str, member: str, weight: int) -> float:
    return rendezvous(key, member, weight)


def _balance(ch: ChannelConfig) -> Balance:
    return Balance(ch.routing.match_threshold, ch.routing.balance_abs, ch.routing.balance_rel)


class ChannelRouter:
    def __init__(
        self,
        channels: tuple[ChannelConfig, ...],
        *,
        cooldown: float = 30.0,
        gateway_id: str | None = None,
        shared_namespace: str = "prefixgate:routing",
        transport: Transport | None = None,
        events: EngineEvents | None = None,
        tokens: EngineTokens | None = None,
        orders: RenderOrders | None = None,
    ) -> None:
        self.channels = channels
        # what the gateway learned of each channel's template (none yet, when not given)
        self.orders = orders if orders is not None else RenderOrders()
        self.events = events  # the engines' KV events (``precise``), or None
        self.tokens = tokens  # the engine's token ids of a request (``precise``)
        self._failures = LogThrottle(log, interval=60.0)
        self.cooldown = cooldown
        self._ejected: dict[str, float] = {}  # base_url -> until (monotonic)
        # base_url -> (digest, when) of the last request whose content an upstream's
        # internal error may be about (report_failure)
        self._suspect: dict[str, tuple[bytes, float]] = {}
        self._down: set[str] = set()  # base_urls whose health probe failed
        self._inflight: dict[str, int] = {}  # base_url -> requests in flight (this gateway)
        self._held: dict[str, Target] = {}  # lease key -> target
        self._turn: dict[str, int] = {}  # channel -> round-robin counter
        self._lru: dict[tuple[str, str], BlockLRU] = {}  # (channel, url) -> block hashes
        self._shared: dict[str, SharedState] = {}  # redis URL -> client
        for ch in channels:
            if ch.routing.shared and ch.routing.shared not in self._shared:
                self._shared[ch.routing.shared] = SharedState(
                    ch.routing.shared,
                    ttl=ch.routing.shared_ttl,
                    namespace=shared_namespace,
                    gateway_id=gateway_id,
                )
        self.health = HealthChecker(channels, self.mark_health, transport=transport)

    # -- what is served ----------------------------------------------------------------
    def models(self) -> list[str]:
        seen: dict[str, None] = {}
        for ch in self.channels:
            for m in (*ch.models, *ch.model_map):
                seen.setdefault(m, None)
        return list(seen)

    def serves(self, model: str) -> bool:
        return any(ch.serves(model) for ch in self.channels)

    # -- choice ------------------------------------------------------------------------
    def _channels(self, model: str, key: str) -> list[ChannelConfig]:
        chans = [c for c in self.channels if c.serves(model)]
        if len(chans) > 1:  # one channel (the common case) needs no hashing
            chans.sort(key=lambda c: (-c.priority, -_score(key, c.name, c.weight)))
        return chans

    def healthy(self, base_url: str) -> bool:
        return base_url not in self._down and not self.is_ejected(base_url)

    def candidates(self, model: str, affinity: str | None) -> list[Target]:
        """The failover order by session affinity alone (no state, no side effects)."""
        key = affinity if affinity is not None else str(random.random())
        healthy: list[Target] = []
        unhealthy: list[Target] = []
        for ch in self._channels(model, key):
            for url in order_session(ch.urls(), key):
                (healthy if self.healthy(url) else unhealthy).append(Target(ch, url))
        return healthy + unhealthy

    async def plan(
        self,
        model: str,
        affinity: str | None,
        *,
        kinds: tuple[str, ...] = ("openai", "anthropic"),
        prompt: PromptOf | None = None,
    ) -> list[Target]:
        """The failover order for one request, each channel's replicas ordered by its
        policy. ``prompt(channel)`` gives the upstream chat request (for ``prefix``)."""
        key = affinity if affinity is not None else str(random.random())
        healthy: list[Target] = []
        unhealthy: list[Target] = []
        for ch in self._channels(model, key):
            if ch.kind not in kinds:
                continue
            all_urls = ch.urls()
            urls = [u for u in all_urls if self.healthy(u)]
            down = [u for u in all_urls if u not in urls] if len(urls) < len(all_urls) else []
            blocks: PromptBlocks | None = None
            matched: dict[str, float] | None = None
            source: str | None = None
            if ch.routing.policy == "prefix" and prompt is not None:
                blocks = prompt_blocks(
                    prompt(ch), ch.routing.block_size, rendering=self.orders.rendering_of(ch)
                )
                source = "estimate"
            elif ch.routing.policy == "precise" and prompt is not None and len(urls) > 1:
                blocks, matched, source = self._precise(ch, urls, prompt(ch), affinity)
            ordered = await self._order(ch, urls, key, blocks, matched)
            healthy += [Target(ch, u, blocks, source) for u in ordered]
            unhealthy += [Target(ch, u, blocks, source) for u in order_session(down, key)]
        return healthy + unhealthy

    def _precise(
        self, ch: ChannelConfig, urls: list[str], request: dict, session: str | None
    ) -> tuple[PromptBlocks, dict[str, float] | None, str]:
        """The prompt's content keys at the engines' block size and each replica's score:
        from its events when they are usable, else from the estimate (the LRU of the keys
        sent there). Without a block size yet or without tokens: the ``prefix`` estimate."""
        events, tokens = self.events, self.tokens
        size = events.block_size(ch.name) if events is not None else None
        keys = None
        n = 0
        if size is not None and tokens is not None:
            from prefixgate.events.tokens import EngineTokensError

            try:
                ids, keys = tokens.content_keys(ch, request, size, session=session)
                n = len(ids)
            except EngineTokensError as err:
                self._failures.warning(ch.name, "routing.policy: precise on %s: %s", ch.name, err)
        if keys is None:
            rendering = self.orders.rendering_of(ch)
            blocks = prompt_blocks(request, ch.routing.block_size, rendering=rendering)
            return blocks, None, "estimate"
        matched: dict[str, float] = {}
        from_events = 0
        for u in urls:
            hit = events.longest_prefix(ch.name, u, keys, touch=False)  # type: ignore[union-attr]
            if hit is None:
                matched[u] = self._lru_of(ch, u).match(keys)
            else:
                matched[u] = precise_score(hit.gpu, hit.blocks)
                from_events += 1
        if from_events == len(urls):
            source = "events"
        else:
            source = "events+estimate" if from_events else "estimate"
        return PromptBlocks(tuple(keys), size, n), matched, source  # type: ignore[arg-type]

    async def _order(
        self,
        ch: ChannelConfig,
        urls: list[str],
        key: str,
        blocks: PromptBlocks | None,
        matched: dict[str, float] | None = None,
    ) -> list[str]:
        if len(urls) <= 1:
            return urls
        if ch.routing.policy == "session":
            return order_session(urls, key)
        if ch.routing.policy == "round_robin":
            turn = self._turn.get(ch.name, 0)
            self._turn[ch.name] = turn + 1
            return order_round_robin(urls, turn)
        hashes = blocks.hashes if blocks is not None else ()
        if matched is not None:
            replicas = [Replica(u, self._inflight.get(u, 0), matched[u]) for u in urls]
        else:
            replicas = [
                Replica(
                    u, self._inflight.get(u, 0), self._lru_of(ch, u).match(hashes) if hashes else 0
                )
                for u in urls
            ]
        shared = self._shared.get(ch.routing.shared or "")
        if shared is not None:
            view = await shared.view(ch.name, urls, hashes if ch.routing.policy == "prefix" else ())
            if view is not None:
                for r in replicas:
                    r.inflight += view.inflight.get(r.url, 0)
                    r.matched = max(r.matched, view.matched.get(r.url, 0))
        if ch.routing.policy == "least_busy" or blocks is None:
            return order_least_busy(replicas, key)
        return order_prefix(replicas, len(blocks), key, _balance(ch))

    def _lru_of(self, ch: ChannelConfig, url: str) -> BlockLRU:
        lru = self._lru.get((ch.name, url))
        if lru is None:
            lru = self._lru[(ch.name, url)] = BlockLRU(ch.routing.lru_blocks)
        return lru

    # -- in-flight accounting ----------------------------------------------------------
    def acquire(self, target: Target, lease: str) -> None:
        """A request is being sent to ``target``: count it in flight (until ``release``)
        and, for ``prefix``, remember its blocks as cached there."""
        self.release(lease)
        self._held[lease] = target
        url = target.base_url
        n = self._inflight[url] = self._inflight.get(url, 0) + 1
        ch = target.channel
        shared = self._shared.get(ch.routing.shared or "")
        if shared is not None:
            shared.set_inflight(url, n)
        if target.blocks is not None and ch.routing.policy in ("prefix", "precise"):
            self._lru_of(ch, url).add(target.blocks.hashes)
            if shared is not None and ch.routing.policy == "prefix":
                shared.add_blocks(ch.name, url, target.blocks.hashes, ch.routing.lru_blocks)
        if self.events is not None:
            self.events.note_request(ch.name, url)  # its engine should publish soon

    def release(self, lease: str) -> None:
        """The request is finished (or its attempt failed). Idempotent."""
        target = self._held.pop(lease, None)
        if target is None:
            return
        url = target.base_url
        n = max(0, self._inflight.get(url, 0) - 1)
        if n:
            self._inflight[url] = n
        else:
            self._inflight.pop(url, None)
        shared = self._shared.get(target.channel.routing.shared or "")
        if shared is not None:
            shared.set_inflight(url, n)

    def inflight(self, base_url: str) -> int:
        return self._inflight.get(base_url, 0)

    def shared(self, channel: ChannelConfig) -> SharedState | None:
        return self._shared.get(channel.routing.shared or "")

    # -- health ------------------------------------------------------------------------
    def report_failure(self, target: Target, content: bytes | None = None) -> bool:
        """A failure of ``target``: ejected for the cool-down, unless the failure may be the
        request's own doing (``content``: the request's bytes, for an upstream's internal
        error): then only when another request's content failed there within the cool-down
        too, so that one malformed request cannot eject every replica in turn. Whether it
        was ejected."""
        url = target.base_url
        now = time.monotonic()
        if content is not None:
            digest = hashlib.blake2b(content, digest_size=16).digest()
            last = self._suspect.get(url)
            self._suspect[url] = (digest, now)
            if last is None or last[0] == digest or last[1] + self.cooldown < now:
                return False
        self._ejected[url] = now + self.cooldown
        return True

    def report_success(self, target: Target) -> None:
        self._ejected.pop(target.base_url, None)
        self._suspect.pop(target.base_url, None)

    def is_ejected(self, base_url: str) -> bool:
        return self._ejected.get(base_url, 0.0) > time.monotonic()

    def is_down(self, base_url: str) -> bool:
        return base_url in self._down

    def mark_health(self, channel: ChannelConfig, base_url: str, healthy: bool) -> None:
        """An active probe's verdict. A replica going down loses its estimated cache (it
        comes back cold)."""
        if healthy:
            self._down.discard(base_url)
            return
        if base_url not in self._down:
            self._down.add(base_url)
            lru = self._lru.get((channel.name, base_url))
            if lru is not None:
                lru.clear()
            shared = self._shared.get(channel.routing.shared or "")
            if shared is not None:
                shared.forget(channel.name, base_url)

    # -- lifecycle ---------------------------------------------------------------------
    def adopt(self, previous: ChannelRouter) -> None:
        """Take over from the router of the previous configuration (a reload): the
        in-flight counts and leases (shared, so that the requests still running on the
        previous one count here until they end), each replica's health and the
        round-robin turns, and the prefix router's memory of a replica that stays in a
        channel whose block size and memory bound are unchanged."""
        self._inflight, self._held = previous._inflight, previous._held
        self._ejected, self._down, self._turn = previous._ejected, previous._down, previous._turn
        before = {ch.name: ch for ch in previous.channels}
        for ch in self.channels:
            old = before.get(ch.name)
            if old is None or (old.routing.block_size, old.routing.lru_blocks) != (
                ch.routing.block_size,
                ch.routing.lru_blocks,
            ):
                continue
            for url in ch.urls():
                lru = previous._lru.get((ch.name, url))
                if lru is not None:
                    self._lru[(ch.name, url)] = lru

    async def start(self) -> None:
        """Start the active health checks and the shared-state writers."""
        self.health.start()
        for shared in self._shared.values():
            await shared.start()

    async def aclose(self) -> None:
        await self.health.aclose()
        for shared in self._shared.values():
            await shared.aclose()
