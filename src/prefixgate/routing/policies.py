"""Replica choice within one channel: five policies as pure functions of a state.

Each policy orders the replicas of a channel: the first is the choice, the rest the
failover order. No I/O and no clocks here; the router gathers the state (in-flight counts,
matched prefix blocks) and these functions decide, so every rule is testable on a
hand-made state.

- ``round_robin``: rotate by a per-gateway counter.
- ``least_busy``: fewest requests in flight, ties by rendezvous on the session key.
- ``session``: rendezvous (highest-random-weight) hashing of the session key; the same key
  picks the same replica in every gateway process, with no shared state.
- ``prefix``: SGLang ``cache_aware``'s rule on an estimated cache: if the in-flight load is
  imbalanced (``max - min > balance_abs`` AND ``max > balance_rel * min``) the least busy;
  else, if the best replica's matched share of the prompt's blocks reaches
  ``match_threshold``, the best match (ties: least busy, then rendezvous); else the least
  busy.
- ``precise``: ``prefix``'s rule on what the engines report holding (their KV events):
  the match is :func:`precise_score`, the GPU prefix in full and blocks only in a host
  tier at :data:`HOST_BLOCK_WEIGHT` (they are copied back, not recomputed, but not free).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "POLICIES",
    "Balance",
    "Replica",
    "imbalanced",
    "order_least_busy",
    "order_prefix",
    "order_round_robin",
    "order_session",
    "precise_score",
    "rendezvous",
]

POLICIES = ("round_robin", "least_busy", "session", "prefix", "precise")

# What a leading block held only in a host tier (CPU memory) is worth against one on GPU.
HOST_BLOCK_WEIGHT = 0.5


def rendezvous(key: str, member: str, weight: int = 1) -> float:
    """Weighted rendezvous score of ``member`` for ``key``: the highest score wins.

    BLAKE2b, never the salted ``hash()``, so every process agrees."""
    h = hashlib.blake2b(f"{key}\x00{member}".encode(), digest_size=8).digest()
    u = (int.from_bytes(h, "big") + 1) / 2**64  # (0, 1]
    return -weight / math.log(u) if u < 1.0 else math.inf


@dataclass(slots=True)
class Replica:
    """What a policy knows of one replica."""

    url: str
    inflight: int = 0
    matched: float = 0  # leading prompt blocks cached there (estimated, or a precise score)


@dataclass(frozen=True, slots=True)
class Balance:
    """The ``prefix`` policy's thresholds (SGLang ``cache_aware`` defaults)."""

    match_threshold: float = 0.3
    abs: int = 64
    rel: float = 1.5


def imbalanced(loads: Sequence[int], balance: Balance) -> bool:
    """Load is imbalanced when ``max - min > abs`` AND ``max > rel * min``."""
    if not loads:
        return False
    hi, lo = max(loads), min(loads)
    return hi - lo > balance.abs and hi > balance.rel * lo


def precise_score(gpu: int, blocks: int) -> float:
    """A replica's match from its engine's index: ``gpu`` leading blocks on GPU, ``blocks``
    leading blocks held in some medium (the GPU run continued from a host tier)."""
    return gpu + HOST_BLOCK_WEIGHT * max(0, blocks - gpu)


def order_session(urls: Sequence[str], key: str) -> list[str]:
    return sorted(urls, key=lambda u: -rendezvous(key, u))


def order_round_robin(urls: Sequence[str], turn: int) -> list[str]:
    if not urls:
        return []
    k = turn % len(urls)
    return [*urls[k:], *urls[:k]]


def order_least_busy(replicas: Sequence[Replica], key: str) -> list[str]:
    ranked = sorted(replicas, key=lambda r: (r.inflight, -rendezvous(key, r.url)))
    return [r.url for r in ranked]


def order_prefix(
    replicas: Sequence[Replica], total_blocks: int, key: str, balance: Balance
) -> list[str]:
    """The ``prefix`` policy; ``total_blocks`` is the prompt's number of full blocks."""
    by_load = order_least_busy(replicas, key)
    if total_blocks <= 0 or imbalanced([r.inflight for r in replicas], balance):
        return by_load
    ranked = sorted(replicas, key=lambda r: (-r.matched, r.inflight, -rendezvous(key, r.url)))
    if ranked[0].matched / total_blocks < balance.match_threshold:
        return by_load
    return [r.url for r in ranked]
