"""The prefix cache of one vLLM upstream: the object everyone uses.

``PrefixCache`` joins :mod:`.blocks` (chained hashes) and :mod:`.pool` (blocks, refs,
LRU) and applies vLLM's hit rule::

    hit_blocks = min(longest cached prefix, floor((L - 1) / B))
    cached_tokens = hit_blocks * B

The request lifecycle mirrors the engine: :meth:`PrefixCache.begin` when a request is
scheduled (hit computed, blocks held, new full blocks cached at once, as vLLM v1 does at
allocation time), :meth:`PrefixCache.end` when it finishes (blocks freed tail-first).
:meth:`PrefixCache.process` is both at once, for untimed replay.

Output tokens: vLLM also caches the full blocks that generated tokens complete. Pass them
to ``end(lease, output_tokens=...)``. The final output token is sampled but never fed back
through the model, so the cached chain covers ``prompt + output[:-1]``; its full blocks
continue the prompt's chain. A follow-up request that repeats the answer verbatim can hit
them.

Counters are plain ints named after vLLM's Prometheus counters: ``requests``, ``queries``
(prompt tokens looked up), ``hits`` (prompt tokens served from cache), plus
``evicted_blocks``.

Hooks, for a cache that tells what it does as an engine's KV events do: ``on_evict(hash)``
for each cached block dropped, ``on_store(StoredBlocks)`` for each run of blocks newly
cached with their token ids (blocks of ``begin_blocks`` leases have no tokens and are not
reported). A block cached twice (the last-token rule recomputes one) is reported twice. Every method is guarded by one lock, so the cache can be shared by
threads and by an asyncio server; hashing happens outside the lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from .blocks import Tokens, hash_blocks, num_blocks, num_full_blocks
from .pool import BlockPool, Handle

__all__ = ["CacheResult", "Lease", "PrefixCache", "StoredBlocks"]


@dataclass(frozen=True, slots=True)
class CacheResult:
    """What the upstream would report: ``usage.prompt_tokens`` and ``cached_tokens``."""

    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class StoredBlocks:
    """Blocks newly cached, in chain order: their hashes, their tokens (``block_size``
    each), the hash of the block before them (``None``: they start a chain, under ``salt``)."""

    parent: Hashable | None
    hashes: list[Hashable]
    token_ids: list[int]
    salt: str | None = None


@dataclass(eq=False, slots=True)
class Lease:
    """A scheduled request: its hit, and the blocks it holds until :meth:`PrefixCache.end`."""

    prompt_tokens: int
    cached_tokens: int
    block_hashes: list[Hashable] = field(repr=False)
    handle: Handle = field(repr=False)
    salt: str | None = field(default=None, repr=False)
    # tokens after the last full block; None for a lease from begin_blocks()
    tail: list[int] | None = field(default=None, repr=False)

    @property
    def result(self) -> CacheResult:
        return CacheResult(self.prompt_tokens, self.cached_tokens)


class PrefixCache:
    """vLLM v1 automatic prefix caching for one upstream (one KV cache group)."""

    def __init__(
        self,
        block_size: int = 16,
        capacity_tokens: int | None = None,
        salt: str | None = None,
        *,
        on_evict: Callable[[Hashable], None] | None = None,
        on_store: Callable[[StoredBlocks], None] | None = None,
    ) -> None:
        self.block_size = block_size
        self.salt = salt
        self.pool = BlockPool(block_size, capacity_tokens, on_evict=on_evict)
        self.on_store = on_store
        self._lock = threading.Lock()
        self.requests = 0
        self.queries = 0
        self.hits = 0

    # -- counters ----------------------------------------------------------------------

    @property
    def capacity_tokens(self) -> int | None:
        return self.pool.capacity_tokens

    @property
    def evicted_blocks(self) -> int:
        return self.pool.evicted_blocks

    @property
    def evicted_tokens(self) -> int:
        return self.pool.evicted_blocks * self.block_size

    @property
    def hit_rate(self) -> float:
        """``hits / queries`` over the cache's life (0.0 before any query)."""
        return self.hits / self.queries if self.queries else 0.0

    @property
    def usage(self) -> float:
        return self.pool.usage

    # -- lookups -----------------------------------------------------------------------

    def hash(self, tokens: Tokens, salt: str | None = None) -> list[bytes]:
        """The chained hashes of the full blocks of ``tokens`` under this cache's rules."""
        return hash_blocks(tokens, self.block_size, salt=self._salt(salt))

    def peek(self, tokens: Tokens, salt: str | None = None) -> int:
        """Prompt tokens that would be a cache hit now; no side effects."""
        return self.peek_blocks(self.hash(tokens, salt), len(tokens))

    def peek_blocks(self, block_hashes: Sequence[Hashable], num_tokens: int) -> int:
        """:meth:`peek` for precomputed full-block hashes (e.g. a trace's block ids)."""
        limit = self._max_hit_blocks(num_tokens)
        with self._lock:
            return self.pool.longest_prefix(block_hashes[:limit]) * self.block_size

    # -- the request lifecycle ---------------------------------------------------------

    def begin(self, tokens: Tokens, salt: str | None = None) -> Lease:
        """Schedule a request: compute its hit like vLLM and hold its blocks."""
        salt = self._salt(salt)
        hashes = hash_blocks(tokens, self.block_size, salt=salt)
        lease = self.begin_blocks(hashes, len(tokens))
        lease.salt = salt
        lease.tail = [int(t) for t in tokens[len(hashes) * self.block_size :]]
        if self.on_store is not None:
            hit, added = lease.handle.hit_blocks, lease.handle.num_hashed - lease.handle.hit_blocks
            self._stored(
                hashes[hit - 1] if hit else None, hashes[hit : hit + added], tokens, hit, salt
            )
        return lease

    def begin_blocks(self, block_hashes: Sequence[Hashable], num_tokens: int) -> Lease:
        """:meth:`begin` for precomputed hashes of the FULL blocks of a ``num_tokens``
        prompt (trace replay). Output tokens cannot be added to such a lease."""
        full = num_full_blocks(num_tokens, self.block_size)
        hashes = list(block_hashes[:full])
        extra = num_blocks(num_tokens, self.block_size) - len(hashes)
        with self._lock:
            handle = self.pool.acquire(
                hashes, max_hit_blocks=self._max_hit_blocks(num_tokens), extra_blocks=extra
            )
            cached = handle.hit_blocks * self.block_size
            self.requests += 1
            self.queries += num_tokens
            self.hits += cached
        return Lease(num_tokens, cached, hashes, handle)

    def end(self, lease: Lease, output_tokens: Sequence[int] | None = None) -> None:
        """The request finished: cache the full blocks its output completed (if given),
        then free its blocks tail-first."""
        new_hashes: list[bytes] = []
        computed: list[int] = []
        extra = 0
        if output_tokens is not None and len(output_tokens) > 1:
            if lease.tail is None:
                raise ValueError("output tokens need a lease from begin(), not begin_blocks()")
            computed = lease.tail + [int(t) for t in output_tokens[:-1]]
            if lease.block_hashes:
                last = lease.block_hashes[-1]
                assert isinstance(last, bytes)
                new_hashes = hash_blocks(computed, self.block_size, parent=last)
            else:
                new_hashes = hash_blocks(computed, self.block_size, salt=lease.salt)
            total = lease.prompt_tokens + len(output_tokens) - 1
            extra = num_blocks(total, self.block_size) - len(lease.block_hashes) - len(new_hashes)
        with self._lock:
            before = lease.handle.num_hashed
            if new_hashes or extra:
                self.pool.extend(lease.handle, new_hashes, extra_blocks=extra)
            added = lease.handle.num_hashed - before
            self.pool.release(lease.handle)
        if added and self.on_store is not None:
            parent = lease.block_hashes[-1] if lease.block_hashes else None
            self._stored(parent, new_hashes[:added], computed, 0, lease.salt)

    def process(
        self,
        tokens: Tokens,
        salt: str | None = None,
        output_tokens: Sequence[int] | None = None,
    ) -> CacheResult:
        """``begin`` + ``end``: one untimed request."""
        lease = self.begin(tokens, salt)
        self.end(lease, output_tokens)
        return lease.result

    def process_blocks(self, block_hashes: Sequence[Hashable], num_tokens: int) -> CacheResult:
        """``begin_blocks`` + ``end``: one untimed request from precomputed hashes (the
        cache left as the two leave it; :meth:`BlockPool.process`)."""
        full = num_full_blocks(num_tokens, self.block_size)
        hashes = block_hashes if len(block_hashes) == full else block_hashes[:full]
        extra = num_blocks(num_tokens, self.block_size) - len(hashes)
        with self._lock:
            hit = self.pool.process(
                hashes, max_hit_blocks=self._max_hit_blocks(num_tokens), extra_blocks=extra
            )
            cached = hit * self.block_size
            self.requests += 1
            self.queries += num_tokens
            self.hits += cached
        return CacheResult(num_tokens, cached)

    def reset(self) -> None:
        """Forget every cached block (only when no request is running); counters stay."""
        with self._lock:
            self.pool.clear()

    # -- internals ---------------------------------------------------------------------

    def _stored(
        self,
        parent: Hashable | None,
        hashes: Sequence[Hashable],
        tokens: Tokens,
        first: int,
        salt: str | None,
    ) -> None:
        """Report ``hashes``, the blocks from block ``first`` of ``tokens`` on."""
        if not hashes or self.on_store is None:
            return
        b = self.block_size
        ids = [int(t) for t in tokens[first * b : (first + len(hashes)) * b]]
        self.on_store(StoredBlocks(parent, list(hashes), ids, salt if parent is None else None))

    def _salt(self, salt: str | None) -> str | None:
        return self.salt if salt is None else salt

    def _max_hit_blocks(self, num_tokens: int) -> int:
        return (num_tokens - 1) // self.block_size if num_tokens > 1 else 0

    def __repr__(self) -> str:
        cap = self.capacity_tokens
        return (
            f"PrefixCache(block_size={self.block_size}, capacity_tokens={cap}, "
            f"requests={self.requests}, hits={self.hits}, queries={self.queries})"
        )
