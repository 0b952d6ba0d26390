"""Two KV tiers: the GPU prefix cache and an optional host-memory (L2) tier behind it.

The GPU tier is a :class:`~prefixgate.cache.pool.BlockPool` (vLLM's prefix caching: ref
counts, LRU free queue, tail-first release, last-token rule). The host tier models vLLM's
``OffloadingConnector`` CPU backend: an LRU of blocks in pinned host memory.

- **Stores (writes).** ``offload="through"`` (the OffloadingConnector): every block a
  request computes is written to the host as soon as it is computed (write-through); blocks
  it got from a cache are not written again. ``offload="evict"`` (write-back, like SGLang
  HiCache's ``write_back``): a block is written when the GPU evicts it.
- **Loads (reads).** A request first hits the GPU; only the blocks after the GPU hit are
  looked up in the host (so the host serves only blocks the GPU no longer has), under the
  lookup policy of :mod:`.groups`. Loaded blocks are copied back into the GPU pool.
- **Hybrid groups.** On the GPU all groups of a block are allocated and evicted together,
  so they share one availability; they differ in what they need (:mod:`.groups`). In the
  host, a draft group's volatile trailing blocks of each request are never stored: such a
  block is held for the other groups only, until a later request computes it again
  without it being trailing.

Counters: ``stores``/``loads`` in blocks (and bytes, given ``bytes_per_block``), like
``vllm:kv_offload_total_bytes{transfer_type=GPU_to_CPU|CPU_to_GPU}``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from .groups import DEFAULT_GROUPS, ExternalHit, KVGroup, Policy, agreed_hit, external_hit
from .pool import BlockPool, Handle

__all__ = ["HostTier", "TierLease", "TierResult", "TieredCache"]

Offload = Literal["through", "evict"]


class HostTier:
    """Host-memory blocks in LRU order. Each entry says whether the volatile (draft) groups'
    copy is there too (``True``) or only the other groups' (``False``)."""

    def __init__(
        self,
        block_size: int,
        capacity_tokens: int | None = None,
        *,
        bytes_per_block: int | None = None,
    ) -> None:
        if capacity_tokens is not None and capacity_tokens < 0:
            raise ValueError("host capacity must be >= 0")
        self.block_size = block_size
        self.num_blocks: int | None = (
            None if capacity_tokens is None else capacity_tokens // block_size
        )
        self.bytes_per_block = bytes_per_block
        self.entries: OrderedDict[Hashable, bool] = OrderedDict()
        self.stores = 0  # block writes (GPU -> host)
        self.loads = 0  # block reads (host -> GPU)
        self.evicted = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def complete(self, key: Hashable) -> bool:
        """Whether every group's copy of ``key`` is stored (the draft group's included)."""
        return self.entries.get(key, False)

    def store(self, key: Hashable, complete: bool = True) -> None:
        """Write a block (a no-op for what is already stored; it becomes most recent)."""
        entries = self.entries
        had = entries.get(key)
        if had is None:
            if self.num_blocks is not None:
                if self.num_blocks == 0:
                    return
                if len(entries) >= self.num_blocks:
                    entries.popitem(last=False)
                    self.evicted += 1
            entries[key] = complete
            self.stores += 1
        else:
            entries.move_to_end(key)
            if complete and not had:
                entries[key] = True
                self.stores += 1

    def load(self, keys: Sequence[Hashable]) -> None:
        """Read blocks back to the GPU (they become most recent)."""
        for key in keys:
            self.entries.move_to_end(key)
        self.loads += len(keys)

    @property
    def store_bytes(self) -> int | None:
        return None if self.bytes_per_block is None else self.stores * self.bytes_per_block

    @property
    def load_bytes(self) -> int | None:
        return None if self.bytes_per_block is None else self.loads * self.bytes_per_block


@dataclass(frozen=True, slots=True)
class TierResult:
    """One request's prompt split by where its KV came from."""

    prompt_tokens: int
    gpu_hit_tokens: int
    host_hit_tokens: int = 0
    recompute_tokens: int = 0  # loaded under ``promote`` but recomputed for some groups

    @property
    def cached_tokens(self) -> int:
        return self.gpu_hit_tokens + self.host_hit_tokens

    @property
    def computed_tokens(self) -> int:
        """Prompt tokens prefilled: the misses plus the recomputed part."""
        return self.prompt_tokens - self.cached_tokens + self.recompute_tokens


@dataclass(eq=False, slots=True)
class TierLease:
    result: TierResult
    handle: Handle = field(repr=False)


class TieredCache:
    """A GPU prefix cache with an optional host tier, for hybrid KV groups."""

    def __init__(
        self,
        block_size: int,
        gpu_capacity_tokens: int | None = None,
        host_capacity_tokens: int | None = None,
        *,
        host: bool | None = None,
        groups: Sequence[KVGroup] = DEFAULT_GROUPS,
        policy: Policy = "veto",
        offload: Offload = "through",
        bytes_per_block: int | None = None,
    ) -> None:
        if policy not in ("veto", "promote"):
            raise ValueError(f"policy must be 'veto' or 'promote', not {policy!r}")
        if offload not in ("through", "evict"):
            raise ValueError(f"offload must be 'through' or 'evict', not {offload!r}")
        self.block_size = block_size
        self.groups = tuple(groups)
        if not self.groups:
            raise ValueError("at least one KV group is needed")
        self.policy: Policy = policy
        self.offload: Offload = offload
        use_host = host_capacity_tokens is not None if host is None else host
        self.host: HostTier | None = (
            HostTier(block_size, host_capacity_tokens, bytes_per_block=bytes_per_block)
            if use_host
            else None
        )
        on_evict = self._spill if self.host is not None and offload == "evict" else None
        self.gpu = BlockPool(block_size, gpu_capacity_tokens, on_evict=on_evict)
        self.volatile = max((g.volatile_blocks for g in self.groups), default=0)
        self._has_window = any(g.kind == "window" for g in self.groups)
        self._all_full = all(g.kind == "full" for g in self.groups)
        self._trailing: set[Hashable] = set()  # volatile blocks not yet stored for all groups

    # -- lookups -----------------------------------------------------------------------

    def _query_blocks(self, keys: Sequence[Hashable], num_tokens: int) -> int:
        cap = (num_tokens - 1) // self.block_size if num_tokens > 1 else 0
        return min(cap, len(keys), num_tokens // self.block_size)

    def gpu_hit_blocks(self, keys: Sequence[Hashable], num_tokens: int) -> int:
        """Blocks the GPU would serve now (every group agreeing); no side effects."""
        q = self._query_blocks(keys, num_tokens)
        if not self._has_window:
            return self.gpu.longest_prefix(keys[:q])
        gpu = self.gpu
        present = [k in gpu for k in keys[:q]]
        return agreed_hit(self.groups, [present] * len(self.groups), self.block_size, q)

    def host_hit(self, keys: Sequence[Hashable], num_tokens: int, start: int) -> ExternalHit:
        """What the host tier would add after a GPU hit of ``start`` blocks."""
        host = self.host
        q = self._query_blocks(keys, num_tokens)
        if host is None or start >= q:
            return ExternalHit(0)
        entries = host.entries
        if self._all_full:
            e = start
            while e < q and keys[e] in entries:
                e += 1
            return ExternalHit(e - start)
        head = [True] * start
        base = head + [k in entries for k in keys[start:q]]
        drafts = head + [entries.get(k, False) for k in keys[start:q]]
        present = [drafts if g.kind == "draft" else base for g in self.groups]
        return external_hit(self.groups, present, self.block_size, q, start, self.policy)

    # -- the request lifecycle -----------------------------------------------------------

    def begin(self, keys: Sequence[Hashable], num_tokens: int) -> TierLease:
        """Schedule a request whose full blocks have ``keys`` (extra keys, e.g. a partial
        last block's id, are ignored): look up both tiers, load, hold the blocks, and
        write what it computes to the host (write-through)."""
        bs = self.block_size
        n_full = min(len(keys), num_tokens // bs)
        g = self.gpu_hit_blocks(keys, num_tokens)
        ext = self.host_hit(keys, num_tokens, g)
        loaded = ext.blocks
        host = self.host
        if loaded:
            assert host is not None
            host.load(keys[g : g + loaded])
        extra = -(-num_tokens // bs) - n_full
        handle = self.gpu.acquire(keys[:n_full], max_hit_blocks=g, extra_blocks=extra)
        if host is not None:
            self._write(keys, g + loaded, n_full)
        result = TierResult(num_tokens, g * bs, loaded * bs, ext.recompute_tokens)
        return TierLease(result, handle)

    def end(self, lease: TierLease) -> None:
        """The request finished: its GPU blocks are freed tail-first."""
        self.gpu.release(lease.handle)

    def process(self, keys: Sequence[Hashable], num_tokens: int) -> TierResult:
        lease = self.begin(keys, num_tokens)
        self.end(lease)
        return lease.result

    # -- internals -----------------------------------------------------------------------

    def _write(self, keys: Sequence[Hashable], first: int, n_full: int) -> None:
        """Blocks ``[first, n_full)`` were computed; the last ``volatile`` of them lack the
        draft group's copy."""
        cut = max(first, n_full - self.volatile)
        trailing = self._trailing
        if self.offload == "evict":
            if self.volatile:
                for k in keys[first:cut]:
                    trailing.discard(k)
                trailing.update(keys[cut:n_full])
            return
        host = self.host
        assert host is not None
        store = host.store
        for k in keys[first:cut]:
            store(k)
        for k in keys[cut:n_full]:
            store(k, False)

    def _spill(self, key: Hashable) -> None:
        assert self.host is not None
        if key in self._trailing:
            self._trailing.discard(key)
            self.host.store(key, False)
        else:
            self.host.store(key)

    def __repr__(self) -> str:
        host = "none" if self.host is None else f"{self.host.num_blocks or 'unlimited'} blocks"
        return (
            f"TieredCache(block_size={self.block_size}, gpu={self.gpu!r}, host={host}, "
            f"policy={self.policy!r})"
        )
