"""The cache model's view of a channel's replicas, fed the recorded prompts: what the
ledger says without engine events, and the model's prediction beside the index's.

A request's upstream prompt is its captured segments (``segments_out``) as pseudo tokens:
a run of deterministic ids per segment, derived from its hash and as long as its
estimated tokens, the doctor's replay (:mod:`prefixgate.doctor.predict`) online. Equal
segments give equal runs, so equal prefixes share blocks. Each replica has a
:class:`~prefixgate.cache.PrefixCache` of ``capacity_tokens`` (LRU beyond): what that
replica computed recently. For a request the model gives

- ``here``: what the serving replica would hit had it kept everything it computed
  (the engine's ``cached_tokens`` below that is read as evicted);
- ``best``: the most another replica would hit (a routing loss beyond ``here``);

in the estimate's units scaled to the request's real ``prompt_tokens``. Then the prompt is
stored on the serving replica's model, as the engine does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from prefixgate.cache import PrefixCache
from prefixgate.doctor.predict import key_of
from prefixgate.record.model import Segment

__all__ = ["ModelView", "ReplicaModels"]

CAPACITY_TOKENS = 1_000_000  # per replica: the recent past the model remembers
_RUN_BITS = 20


@dataclass(frozen=True, slots=True)
class ModelView:
    here: int  # tokens the serving replica's model would hit (never evicting)
    best: int  # the most another replica's model would hit
    best_replica: str | None
    scale: float  # real tokens per estimated token


def pseudo_tokens(segments: Sequence[Segment]) -> np.ndarray:
    """The upstream prompt as pseudo tokens: one run per segment (``tool`` segments are
    parts of ``tools``)."""
    runs = []
    for s in segments:
        if s.kind == "tool" or s.tokens <= 0:
            continue
        base = (key_of(s.hash) & ((1 << 40) - 1)) << _RUN_BITS
        runs.append(base + np.arange(s.tokens, dtype=np.int64) % (1 << _RUN_BITS))
    return np.concatenate(runs) if runs else np.zeros(0, dtype=np.int64)


class ReplicaModels:
    """One cache model per replica of one channel."""

    def __init__(self, block_size: int, capacity_tokens: int = CAPACITY_TOKENS) -> None:
        self.block_size = block_size
        self.capacity_tokens = capacity_tokens
        self._caches: dict[str, PrefixCache] = {}

    def _cache(self, replica: str) -> PrefixCache:
        c = self._caches.get(replica)
        if c is None:
            c = self._caches[replica] = PrefixCache(self.block_size, self.capacity_tokens)
        return c

    def see(self, replica: str, segments: Sequence[Segment], prompt_tokens: int) -> ModelView:
        """The model's view of a request to ``replica``, then its prompt stored there."""
        tokens = pseudo_tokens(segments)
        n = len(tokens)
        if n == 0:
            return ModelView(0, 0, None, 1.0)
        scale = prompt_tokens / n if prompt_tokens else 1.0
        mine = self._cache(replica)
        hashes = mine.hash(tokens)
        best, best_replica = 0, None
        for name, cache in self._caches.items():
            if name != replica:
                got = cache.peek_blocks(hashes, n)
                if got > best:
                    best, best_replica = got, name
        here = mine.process_blocks(hashes, n).cached_tokens
        return ModelView(round(here * scale), round(best * scale), best_replica, scale)
