"""Which channel, and which replica of it, serves a request; in failover order.

Channels serving the model are tried by priority (highest first). Within one priority the
order is weighted rendezvous hashing on the request's affinity key (its session), so the
same session keeps landing on the same channel and replica (their prefix caches stay warm)
and several gateway replicas make the same choice without sharing state. Requests without
a key spread by a random draw. A target that failed is ejected for a cool-down (passive
health) and tried last until then.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from dataclasses import dataclass

from prefixgate.config import ChannelConfig


@dataclass(frozen=True, slots=True)
class Target:
    channel: ChannelConfig
    base_url: str

    @property
    def name(self) -> str:
        return self.channel.name


def _score(key: str, member: str, weight: int) -> float:
    h = hashlib.blake2b(f"{key}\x00{member}".encode(), digest_size=8).digest()
    u = (int.from_bytes(h, "big") + 1) / 2**64  # (0, 1]
    return -weight / math.log(u) if u < 1.0 else math.inf


class ChannelRouter:
    def __init__(self, channels: tuple[ChannelConfig, ...], *, cooldown: float = 30.0) -> None:
        self.channels = channels
        self.cooldown = cooldown
        self._ejected: dict[str, float] = {}  # base_url -> until (monotonic)

    def models(self) -> list[str]:
        seen: dict[str, None] = {}
        for ch in self.channels:
            for m in (*ch.models, *ch.model_map):
                seen.setdefault(m, None)
        return list(seen)

    def serves(self, model: str) -> bool:
        return any(ch.serves(model) for ch in self.channels)

    def candidates(self, model: str, affinity: str | None) -> list[Target]:
        key = affinity if affinity is not None else str(random.random())
        chans = [c for c in self.channels if c.serves(model)]
        chans.sort(key=lambda c: (-c.priority, -_score(key, c.name, c.weight)))
        now = time.monotonic()
        healthy: list[Target] = []
        ejected: list[Target] = []
        for ch in chans:
            urls = sorted(ch.urls(), key=lambda u: -_score(key, u, 1))
            for url in urls:
                t = Target(ch, url)
                (ejected if self._ejected.get(url, 0.0) > now else healthy).append(t)
        return healthy + ejected

    def report_failure(self, target: Target) -> None:
        self._ejected[target.base_url] = time.monotonic() + self.cooldown

    def report_success(self, target: Target) -> None:
        self._ejected.pop(target.base_url, None)

    def is_ejected(self, base_url: str) -> bool:
        return self._ejected.get(base_url, 0.0) > time.monotonic()
