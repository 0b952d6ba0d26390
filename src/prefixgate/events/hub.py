"""``EngineEvents``: the engines' KV-cache events of every channel that publishes them.

One :class:`~.index.EventIndex` per channel with a ``kv_events`` section, one
:class:`~.subscriber.Subscriber` per replica of it, one ZeroMQ context for all; started
and stopped by the app's lifespan (:meth:`EngineEvents.start` / :meth:`aclose`). Readers:

- routing: :meth:`longest_prefix` (``None`` when the replica's events are absent or
  stale: fall back to the estimate), :meth:`content_keys` for a request's token ids;
- the request path: :meth:`note_request` when a request goes to a replica (silence after
  it makes the replica stale);
- ``/healthz``, ``/metrics``, the dashboard: :meth:`statuses` (each replica's stream, its
  publisher connected or not since when, and how many times it connected);
- tests: :meth:`wait_publishers`, until every engine's publisher is connected.

Replicas are named by their URL, as in ``routing/`` (``ChannelConfig.urls()``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq.asyncio

from prefixgate.cache.blocks import Tokens
from prefixgate.config import ChannelConfig, Config

from .index import EventIndex, PrefixHit
from .status import ReplicaStatus
from .subscriber import Subscriber

__all__ = ["ChannelEvents", "EngineEvents"]


@dataclass
class ChannelEvents:
    """One channel's index and its replicas' subscribers."""

    name: str
    index: EventIndex
    subscribers: dict[str, Subscriber] = field(default_factory=dict)


class EngineEvents:
    """Subscribers and indexes of every channel with ``kv_events``; empty when none has."""

    def __init__(
        self,
        channels: Iterable[ChannelConfig],
        *,
        clock: Callable[[], float] = time.monotonic,
        retry_interval: float = 5.0,
    ) -> None:
        self.clock = clock
        self.channels: dict[str, ChannelEvents] = {}
        self._ctx: zmq.asyncio.Context | None = None
        for ch in channels:
            kv = ch.kv_events
            if kv is None:
                continue
            index = EventIndex(kv.max_blocks, kv.block_size, kv.history_blocks)
            events = self.channels[ch.name] = ChannelEvents(ch.name, index)
            for url, endpoints in kv.endpoints_for(ch.urls()).items():
                events.subscribers[url] = Subscriber(
                    url,
                    endpoints,
                    index,
                    stale_after=kv.stale_after,
                    replay_timeout=kv.replay_timeout,
                    retry_interval=retry_interval,
                    clock=clock,
                )

    @classmethod
    def from_config(cls, config: Config, **kw: Any) -> EngineEvents:
        return cls(config.channels, **kw)

    def __bool__(self) -> bool:
        return bool(self.channels)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Open every subscriber (in the background: an engine that is not up yet, or an
        address in use, is retried and shows on the status, never fails the start)."""
        if not self.channels or self._ctx is not None:
            return
        self._ctx = zmq.asyncio.Context()
        for sub in self._subscribers():
            sub.start(self._ctx)

    async def wait_ready(self) -> None:
        """Until every subscriber's socket is open (tests; the gateway does not wait)."""
        for sub in self._subscribers():
            await sub.ready.wait()

    def listening(self) -> bool:
        """Whether every subscriber is open, has read its replay and has a publisher
        connected: what the engines publish from now on reaches the indexes."""
        return all(sub.listening for sub in self._subscribers())

    async def wait_publishers(self, timeout: float | None = None) -> None:
        """Until :meth:`listening` (tests, and tools that must not lose an engine's first
        events to ZeroMQ's late join; the gateway does not wait). ``TimeoutError``, naming
        the replicas still without a publisher, past ``timeout`` seconds."""
        subs = self._subscribers()
        try:
            async with asyncio.timeout(timeout):
                while not self.listening():  # one may have left while another was awaited
                    for sub in subs:
                        await sub.wait_publisher()
        except TimeoutError:
            missing = ", ".join(s.replica for s in subs if not s.listening)
            raise TimeoutError(
                f"no KV-event publisher connected within {timeout} s: {missing}"
            ) from None

    async def aclose(self) -> None:
        for sub in self._subscribers():
            await sub.aclose()
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            ctx.term()

    def _subscribers(self) -> list[Subscriber]:
        return [s for ch in self.channels.values() for s in ch.subscribers.values()]

    # -- readers --------------------------------------------------------------------------

    def subscriber(self, channel: str, replica: str) -> Subscriber | None:
        ch = self.channels.get(channel)
        return None if ch is None else ch.subscribers.get(replica)

    def status(self, channel: str, replica: str) -> ReplicaStatus | None:
        sub = self.subscriber(channel, replica)
        return None if sub is None else sub.status

    def usable(self, channel: str, replica: str) -> bool:
        """Whether the replica's events can be trusted now (present and not stale)."""
        st = self.status(channel, replica)
        return st is not None and not st.stale(self.clock())

    def block_size(self, channel: str) -> int | None:
        ch = self.channels.get(channel)
        return None if ch is None else ch.index.block_size

    def content_keys(self, channel: str, token_ids: Tokens) -> list[bytes]:
        """A request's content keys at the channel's block size (none if unknown yet)."""
        ch = self.channels.get(channel)
        return [] if ch is None else ch.index.content_keys(token_ids)

    def longest_prefix(
        self, channel: str, replica: str, keys: Sequence[bytes], *, touch: bool = True
    ) -> PrefixHit | None:
        """Leading blocks of ``keys`` the replica's engine holds, or ``None`` when its
        events are absent or stale (the caller falls back to its estimate)."""
        if not self.usable(channel, replica):
            return None
        return self.channels[channel].index.longest_prefix(replica, keys, touch=touch)

    def note_request(self, channel: str, replica: str) -> None:
        st = self.status(channel, replica)
        if st is not None:
            st.note_request(self.clock())

    def statuses(self) -> list[dict[str, Any]]:
        """Every replica's stream and index, as plain data."""
        now = self.clock()
        out = []
        for ch in self.channels.values():
            replicas = ch.index.replicas()
            for url, sub in ch.subscribers.items():
                row = {"channel": ch.name, **sub.status.as_dict(now)}
                r = replicas.get(url)
                row["block_size"] = None if r is None else r.block_size
                row["blocks"] = {} if r is None else r.sizes()
                row["index"] = {} if r is None else dataclasses.asdict(r.counters)
                out.append(row)
        return out
