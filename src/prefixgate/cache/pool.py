"""vLLM's KV block pool: cached blocks, reference counts and the LRU free queue.

The rules modelled (vLLM v1 ``BlockPool`` / ``KVCacheManager``):

- A map from block hash to the block(s) holding it. Duplicates are allowed: when the
  last-token rule stops a hit one block early, the request recomputes that block into a
  new block that gets the same hash; a lookup uses the oldest copy.
- Each block has a reference count. Blocks with count 0 sit in the free queue, least
  recently used first. A hit on a free block takes it out of the queue (``touch``).
- A finished request frees its blocks TAIL-FIRST: its last block joins the queue first,
  so the end of a chain is evicted before its start.
- Eviction is lazy: a free block keeps its hash, and can be hit again, until the pool
  hands it out for a new block; only then is its hash dropped.
- Never-used blocks are handed out before any cached block is evicted (they sit at the
  head of vLLM's initial free queue).

With ``capacity_tokens=None`` the pool is unlimited and never evicts. A capacity is
rounded down to whole blocks (vLLM's reserved null block is not counted: give the usable
capacity). Keys may be any hashable (the 16-byte hashes of :mod:`.blocks`, or a trace's
integer block ids).

Choices where vLLM would queue or preempt instead (this model has no scheduler):
- A request that needs more free blocks than exist gets what fits: the leading blocks of
  its chain are cached, the rest are not, and its handle is marked ``complete=False``.
- Whole requests are allocated at once (no chunked prefill, no preemption).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from itertools import takewhile
from operator import itemgetter

from prefixgate.sequences import common_prefix

__all__ = ["BlockPool", "Handle"]

_first = itemgetter(0)
RUNS_MAX = 64  # runs kept apart at the free queue's end (BlockPool.process)


@dataclass(eq=False, slots=True)
class _Run:
    """Blocks a processed request released, in chain order (queued tail first), and the
    hashes of the leading ones, each of which it holds the oldest copy of."""

    blocks: list[int]
    known: list[Hashable]


@dataclass(eq=False, slots=True)
class Handle:
    """The blocks one running request holds, in chain order.

    ``blocks[:num_hashed]`` carry hashes (hits first, then newly cached blocks); the rest
    are uncached blocks (the partial last block, room for output).
    """

    blocks: list[int] = field(default_factory=list)
    num_hashed: int = 0
    hit_blocks: int = 0
    complete: bool = True
    released: bool = False


class BlockPool:
    """A KV block pool with vLLM's prefix-caching semantics. Not thread-safe by itself;
    :class:`~prefixgate.cache.prefix_cache.PrefixCache` wraps it in a lock."""

    def __init__(
        self,
        block_size: int,
        capacity_tokens: int | None = None,
        *,
        on_evict: Callable[[Hashable], None] | None = None,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, not {block_size}")
        if capacity_tokens is not None and capacity_tokens < 0:
            raise ValueError(f"capacity_tokens must be >= 0, not {capacity_tokens}")
        self.block_size = block_size
        self.num_blocks: int | None = (
            None if capacity_tokens is None else capacity_tokens // block_size
        )
        self.on_evict = on_evict
        self._key: list[Hashable | None] = []  # per block id: its hash, or None
        self._ref: list[int] = []  # per block id: reference count
        self._cached: dict[Hashable, list[int]] = {}  # hash -> block ids, oldest first
        self._free: OrderedDict[int, None] = OrderedDict()  # LRU first
        # the free queue's end: runs of the blocks of requests ``process`` ran, oldest
        # first (the queue is ``_free`` then each run's blocks reversed), and each run by
        # its first kept hash
        self._runs: OrderedDict[_Run, None] = OrderedDict()
        self._starts: dict[Hashable, _Run] = {}
        self._used = 0
        self._num_cached = 0
        self.hit_blocks = 0  # blocks served from the cache
        self.allocated_blocks = 0  # blocks handed out for new content
        self.evicted_blocks = 0  # cached blocks whose hash was dropped on reuse

    # -- queries (no side effects) ---------------------------------------------------

    @property
    def capacity_tokens(self) -> int | None:
        return None if self.num_blocks is None else self.num_blocks * self.block_size

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by running requests."""
        return self._used

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that carry a hash (in use or free)."""
        return self._num_cached

    @property
    def num_free_blocks(self) -> int | None:
        """Blocks available for new content (``None`` when unlimited)."""
        return None if self.num_blocks is None else self.num_blocks - self._used

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, like ``vllm:kv_cache_usage_perc`` (0.0 if unlimited)."""
        if not self.num_blocks:
            return 0.0
        return self._used / self.num_blocks

    def __contains__(self, block_hash: Hashable) -> bool:
        return block_hash in self._cached

    def longest_prefix(self, hashes: Sequence[Hashable]) -> int:
        """Number of leading ``hashes`` that are cached now."""
        return len(list(takewhile(self._cached.__contains__, hashes)))  # a loop in C

    def copies(self) -> dict[Hashable, int]:
        """Each cached hash and the number of blocks holding it (what an engine's events
        describe: one store per block cached, one removal per block dropped)."""
        return {h: len(bids) for h, bids in self._cached.items()}

    def free_order(self) -> list[Hashable | None]:
        """Hashes of the free blocks in eviction order (next victim first); for tests
        and inspection."""
        self._settle()
        return [self._key[b] for b in self._free]

    # -- the request lifecycle -------------------------------------------------------

    def acquire(
        self,
        hashes: Sequence[Hashable],
        *,
        max_hit_blocks: int | None = None,
        extra_blocks: int = 0,
    ) -> Handle:
        """Schedule a request whose full blocks have ``hashes``.

        Hits (the longest cached prefix, at most ``max_hit_blocks``) are touched: taken
        out of the free queue, reference count + 1. Every later hash gets a new block,
        evicting the LRU free block when the pool is full. ``extra_blocks`` uncached
        blocks (the partial last block) are held too when the pool is bounded; they
        matter only for capacity and eviction order.
        """
        self._settle()
        limit = len(hashes) if max_hit_blocks is None else max(0, min(max_hit_blocks, len(hashes)))
        hit = self.longest_prefix(hashes[:limit])
        handle = Handle(hit_blocks=hit)
        blocks = handle.blocks
        ref, free, cached = self._ref, self._free, self._cached
        for h in hashes[:hit]:
            bid = cached[h][0]
            if ref[bid] == 0:
                del free[bid]
                self._used += 1
            ref[bid] += 1
            blocks.append(bid)
        handle.num_hashed = hit
        self.hit_blocks += hit
        self._append_hashed(handle, hashes[hit:])
        self._append_uncached(handle, extra_blocks)
        return handle

    def process(
        self,
        hashes: Sequence[Hashable],
        *,
        max_hit_blocks: int | None = None,
        extra_blocks: int = 0,
    ) -> int:
        """:meth:`acquire` then :meth:`release` at once (a request that finishes as it is
        scheduled: untimed replay), its hit blocks returned; the pool is left as the two
        calls leave it (the same blocks, hashes, free order, evictions and counters).

        The blocks of the requests processed last are kept apart at the free queue's end,
        as runs in chain order (up to :data:`RUNS_MAX`): a request whose hits are the
        starts of runs takes each start by one comparison of lists, the rest of the run
        staying where it stood, and those blocks, released tail first, end the queue in
        the same order as a run of its own: they are not moved one by one. So a request
        costs what its new blocks cost, not its length. Any other call settles the runs
        into the queue first."""
        if self._used:  # another request holds blocks: the two calls as they are
            return self._acquire_release(hashes, max_hit_blocks, extra_blocks)
        limit = len(hashes) if max_hit_blocks is None else max(0, min(max_hit_blocks, len(hashes)))
        hashes = hashes if isinstance(hashes, list) else list(hashes)
        runs, starts = self._runs, self._starts
        taken: list[tuple[_Run, int]] = []  # the starts of runs the hits are, in order
        k = 0
        while k < limit:
            run = starts.get(hashes[k])
            if run is None or any(r is run for r, _ in taken):
                break
            q = common_prefix(
                hashes if k == 0 and limit == len(hashes) else hashes[k:limit], run.known
            )
            taken.append((run, q))
            k += q
        cached, free = self._cached, self._free
        hit = k + self.longest_prefix(hashes[k:limit])
        # nothing is held, so every cached block is queued: the hits beyond the runs'
        # starts leave the free queue (as acquire holds them) while new blocks are found
        more = list(map(_first, map(cached.__getitem__, hashes[k:hit])))
        if more and not (len(set(more)) == len(more) and all(map(free.__contains__, more))):
            self._settle()  # a hash repeated in the prompt: the two calls
            return self._acquire_release(hashes, max_hit_blocks, extra_blocks)
        blocks: list[int] = []
        known: list[Hashable] = []
        for run, q in taken:  # each run's start taken, the rest left where it stands
            del starts[run.known[0]]
            if not blocks:
                # the first run's lists become the request's, cut after its start: the
                # blocks and hashes it keeps are not copied (each would be touched)
                blocks, known = run.blocks, run.known
                run.blocks, run.known = blocks[q:], known[q:]
                del blocks[q:], known[q:]
            else:
                blocks += run.blocks[:q]
                known += run.known[:q]
                del run.blocks[:q]
                del run.known[:q]
            if run.known:
                starts[run.known[0]] = run
            if not run.blocks:
                del runs[run]
        deque(map(free.__delitem__, more), maxlen=0)
        self.hit_blocks += hit
        blocks += more
        known += hashes[k:hit]
        oldest = True  # the new blocks hold the first copy of their hash
        complete = True
        for h in hashes[hit:]:
            bid = self._take()
            if bid is None:
                complete = False
                break
            oldest = oldest and h not in cached
            self._insert(h, bid)
            blocks.append(bid)
            if oldest:
                known.append(h)
        if complete and self.num_blocks is not None:
            for _ in range(extra_blocks):
                bid = self._take()
                if bid is None:
                    break
                blocks.append(bid)
        if blocks:
            run = _Run(blocks, known)
            runs[run] = None
            if known:
                starts[known[0]] = run
            if len(runs) > RUNS_MAX:
                self._settle_oldest()
        return hit

    def _acquire_release(
        self, hashes: Sequence[Hashable], max_hit_blocks: int | None, extra_blocks: int
    ) -> int:
        handle = self.acquire(hashes, max_hit_blocks=max_hit_blocks, extra_blocks=extra_blocks)
        self.release(handle)
        return handle.hit_blocks

    def _settle_oldest(self) -> None:
        """The oldest run into the free queue, where it stands (right after it)."""
        run, _ = self._runs.popitem(last=False)
        if run.known:
            del self._starts[run.known[0]]
        self._free.update(dict.fromkeys(reversed(run.blocks)))

    def _settle(self) -> None:
        """Every run into the free queue, where they stand."""
        while self._runs:
            self._settle_oldest()

    def extend(self, handle: Handle, hashes: Sequence[Hashable], extra_blocks: int = 0) -> None:
        """Cache more full blocks of a running request's chain (output tokens filled
        them), then make it hold ``extra_blocks`` uncached blocks after them. Uncached
        blocks it already holds are filled first, as vLLM fills the partial block."""
        if handle.released:
            raise ValueError("handle already released")
        if not handle.complete:
            return  # the chain has a gap; later blocks cannot be cached
        self._settle()
        self._append_hashed(handle, hashes)
        self._append_uncached(handle, extra_blocks)

    def release(self, handle: Handle) -> None:
        """A request finished: drop its references, tail first."""
        if handle.released:
            raise ValueError("handle already released")
        self._settle()
        handle.released = True
        ref, key, free = self._ref, self._key, self._free
        bounded = self.num_blocks is not None
        for bid in reversed(handle.blocks):
            r = ref[bid] - 1
            ref[bid] = r
            if r == 0:
                self._used -= 1
                if bounded or key[bid] is not None:
                    free[bid] = None

    def clear(self) -> None:
        """Forget every cached hash (vLLM's reset_prefix_cache); only when idle."""
        if self._used:
            raise RuntimeError("cannot clear the pool while blocks are in use")
        self._settle()
        self._key.clear()
        self._ref.clear()
        self._cached.clear()
        self._free.clear()
        self._num_cached = 0

    # -- internals ---------------------------------------------------------------------

    def _append_hashed(self, handle: Handle, hashes: Sequence[Hashable]) -> None:
        blocks = handle.blocks
        i = handle.num_hashed
        for h in hashes:
            if i < len(blocks):
                bid = blocks[i]  # an uncached block this request already holds
            else:
                new = self._allocate()
                if new is None:
                    handle.complete = False
                    break
                bid = new
                blocks.append(bid)
            self._insert(h, bid)
            i += 1
        handle.num_hashed = i

    def _append_uncached(self, handle: Handle, extra_blocks: int) -> None:
        if self.num_blocks is None or not handle.complete:
            return  # unlimited: uncached blocks change nothing
        want = handle.num_hashed + extra_blocks
        while len(handle.blocks) < want:
            bid = self._allocate()
            if bid is None:
                handle.complete = False
                return
            handle.blocks.append(bid)

    def _allocate(self) -> int | None:
        """A block with reference count 1 and no hash, or ``None`` if the pool is full."""
        bid = self._take()
        if bid is not None:
            self._ref[bid] = 1
            self._used += 1
        return bid

    def _take(self) -> int | None:
        """A block with no hash and reference count 0 that is in no queue (a new one, or
        the least recently used free one, its hash evicted), or ``None`` if the pool is
        full."""
        if self.num_blocks is None or len(self._key) < self.num_blocks:
            bid = len(self._key)
            self._key.append(None)
            self._ref.append(0)
        elif self._free or self._runs:
            if not self._free:  # the oldest run is next in the queue
                self._settle_oldest()
            bid, _ = self._free.popitem(last=False)
            old = self._key[bid]
            if old is not None:
                self._uncache(old, bid)
                self.evicted_blocks += 1
                if self.on_evict is not None:
                    self.on_evict(old)
        else:
            return None
        self.allocated_blocks += 1
        return bid

    def _insert(self, block_hash: Hashable, bid: int) -> None:
        self._key[bid] = block_hash
        self._num_cached += 1
        holders = self._cached.get(block_hash)
        if holders is None:
            self._cached[block_hash] = [bid]
        else:
            holders.append(bid)

    def _uncache(self, block_hash: Hashable, bid: int) -> None:
        holders = self._cached[block_hash]
        holders.remove(bid)
        if not holders:
            del self._cached[block_hash]
        self._key[bid] = None
        self._num_cached -= 1

    def __repr__(self) -> str:
        cap = "unlimited" if self.num_blocks is None else f"{self.num_blocks} blocks"
        return (
            f"BlockPool(block_size={self.block_size}, {cap}, used={self._used}, "
            f"cached={self._num_cached})"
        )
