"""What a cache model says about itself in an engine's words: KV events from a PrefixCache.

:class:`CacheEventEmitter` is given to a :class:`~prefixgate.cache.PrefixCache` as its
``on_store`` / ``on_evict`` hooks and collects the events an engine would publish for the
same changes, in order; :meth:`CacheEventEmitter.take` hands over what collected since the
last call (one batch per scheduler step, in vLLM's terms: the simulated upstream takes a
batch after scheduling a request and after finishing it).

Block hashes on the wire are u64 like vLLM's, derived from the cache model's 16-byte keys
with a seed drawn per emitter, as vLLM draws one per process: a subscriber that keyed blocks
by these hashes would break on the next restart; the index re-keys them by content and
ends on the cache model's own keys. A ``cache_salt`` goes into the first block's
``extra_keys``, as vLLM puts it there.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Hashable

from prefixgate.cache import StoredBlocks
from prefixgate.events.wire import GPU_MEDIUM, AllBlocksCleared, BlockRemoved, BlockStored, Event

__all__ = ["CacheEventEmitter"]


class CacheEventEmitter:
    """Collects engine events for one cache's stores and evictions (thread-safe)."""

    def __init__(self, block_size: int, seed: int | None = None) -> None:
        self.block_size = block_size
        self.seed = random.SystemRandom().getrandbits(64) if seed is None else seed
        self._lock = threading.Lock()
        self._events: list[Event] = []

    def engine_hash(self, key: Hashable) -> int:
        """The u64 an engine with this emitter's seed names the block ``key`` by."""
        raw = key if isinstance(key, bytes) else repr(key).encode()
        return int.from_bytes(raw[:8].ljust(8, b"\0"), "little") ^ self.seed

    def stored(self, blocks: StoredBlocks) -> None:
        """``PrefixCache(on_store=...)``."""
        n = len(blocks.hashes)
        extra: list[list[str] | None] = [None] * n
        if blocks.salt is not None:
            extra[0] = [blocks.salt]
        event = BlockStored(
            [self.engine_hash(h) for h in blocks.hashes],
            None if blocks.parent is None else self.engine_hash(blocks.parent),
            blocks.token_ids,
            self.block_size,
            None,
            GPU_MEDIUM,
            None,
            extra,
            0,
            "full_attention",
        )
        with self._lock:
            self._events.append(event)

    def evicted(self, key: Hashable) -> None:
        """``PrefixCache(on_evict=...)`` (one block: an engine batches them per step)."""
        h = self.engine_hash(key)
        with self._lock:
            last = self._events[-1] if self._events else None
            if isinstance(last, BlockRemoved):
                last.block_hashes.append(h)
            else:
                self._events.append(BlockRemoved([h], GPU_MEDIUM, 0))

    def cleared(self) -> None:
        with self._lock:
            self._events.append(AllBlocksCleared())

    def take(self) -> list[Event]:
        """The events since the last call, in order."""
        with self._lock:
            events, self._events = self._events, []
        return events
