"""The GPU tier and the host-memory tier behind it."""

from __future__ import annotations

import pytest

from prefixgate.cache.groups import parse_groups
from prefixgate.cache.tiers import HostTier, TieredCache, TierResult

B = 4


def test_gpu_eviction_spills_to_host_and_host_serves_it():
    cache = TieredCache(B, gpu_capacity_tokens=8, host=True, offload="evict")
    assert cache.process(["a1", "a2"], 8) == TierResult(8, 0, 0)
    assert cache.host is not None and cache.host.stores == 0  # nothing evicted yet
    cache.process(["b1", "b2"], 8)  # evicts a2, then a1 (tail first)
    assert cache.host.stores == 2
    assert "a1" in cache.host and "a2" in cache.host
    # a1 is gone from the GPU; the host serves it (a2 is beyond the last-token cap)
    assert cache.process(["a1", "a2"], 8) == TierResult(8, 0, 4)
    assert cache.host.loads == 1


def test_write_through_stores_when_computed_and_host_hits_only_after_gpu_eviction():
    cache = TieredCache(B, gpu_capacity_tokens=8, host=True)
    cache.process(["a1", "a2"], 8)
    assert cache.host is not None and cache.host.stores == 2  # written at once
    # still on the GPU: a GPU hit, the host copy is not read
    assert cache.process(["a1", "a2"], 8) == TierResult(8, 4, 0)
    assert cache.host.loads == 0
    assert cache.host.stores == 2  # cached blocks are not written again
    cache.process(["b1", "b2"], 8)  # evicts a1, a2 from the GPU
    assert cache.process(["a1", "a2"], 8) == TierResult(8, 0, 4)
    assert cache.host.loads == 1


def test_capacities_are_honoured():
    cache = TieredCache(B, gpu_capacity_tokens=10, host_capacity_tokens=8)
    assert cache.gpu.num_blocks == 2  # rounded down to whole blocks
    assert cache.host is not None and cache.host.num_blocks == 2
    for i in range(5):
        cache.process([f"k{i}a", f"k{i}b"], 8)
        assert len(cache.host) <= 2
        assert cache.gpu.num_cached_blocks <= 2
    assert list(cache.host.entries) == ["k4a", "k4b"]  # LRU keeps the newest
    assert cache.host.evicted == 8
    assert cache.host.stores == 10


def test_unlimited_host_and_no_host():
    assert TieredCache(B).host is None
    cache = TieredCache(B, 8, host=True)
    assert cache.host is not None and cache.host.num_blocks is None
    with pytest.raises(ValueError):
        TieredCache(B, policy="nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TieredCache(B, offload="nope")  # type: ignore[arg-type]


def test_host_bytes_are_counted_per_block():
    host = HostTier(B, bytes_per_block=1000)
    host.store("a")
    host.store("a")  # already there: not written again
    host.store("b", complete=False)
    host.store("b")  # the missing group's copy is written now
    host.load(["a"])
    assert (host.stores, host.loads) == (3, 1)
    assert (host.store_bytes, host.load_bytes) == (3000, 1000)


def test_draft_groups_volatile_trailing_block_is_never_offloaded():
    cache = TieredCache(B, host=True, groups=parse_groups("full,draft:1"))
    cache.process(["a", "b", "c"], 13)
    host = cache.host
    assert host is not None
    assert "c" in host and not host.complete("c")  # held for full attention only
    assert host.complete("a") and host.complete("b")
    # write-back: the trailing block spills without its draft copy too
    wb = TieredCache(B, 8, host=True, groups=parse_groups("full,draft:1"), offload="evict")
    wb.process(["a", "b"], 8)
    wb.process(["x", "y"], 8)
    assert wb.host is not None and wb.host.complete("a") and not wb.host.complete("b")


def _seed_like(policy: str) -> tuple[TieredCache, TierResult]:
    """GPU of 3 blocks, unlimited host, full + window:4 + draft:1."""
    cache = TieredCache(
        B, 12, host=True, groups=parse_groups("full,window:4,draft:1"), policy=policy
    )
    cache.process(["a", "b", "c"], 12)  # stores a, b (+ c without its draft copy)
    cache.process(["x", "y", "z"], 12)  # evicts c, b, a from the GPU
    return cache, cache.process(["a", "b", "c", "d"], 16)


def test_veto_zeroes_the_external_hit_when_the_draft_group_misses():
    cache, res = _seed_like("veto")
    assert res == TierResult(16, 0, 0, 0)
    assert res.computed_tokens == 16
    assert cache.host is not None
    assert cache.host.loads == 0
    # 3 + 3 first writes, then c's draft copy and d: written again and again, never read
    assert cache.host.stores == 8


def test_promote_loads_the_full_prefix_and_recomputes_a_window():
    cache, res = _seed_like("promote")
    assert res == TierResult(16, 0, 12, 4)  # 3 blocks loaded, 4 tokens recomputed
    assert res.computed_tokens == 8
    assert cache.host is not None
    assert cache.host.loads == 3
    assert cache.host.stores == 7


def test_window_only_model_hits_on_the_gpu_despite_a_missing_head():
    cache = TieredCache(B, groups=parse_groups("window:8"))
    cache.process(["a", "b", "c", "d"], 16)
    # block 0 differs; the window (blocks 1 and 2 before the cap of 3 blocks) is cached
    assert cache.process(["z", "b", "c", "d"], 16) == TierResult(16, 12)
    full = TieredCache(B)
    full.process(["a", "b", "c", "d"], 16)
    assert full.process(["z", "b", "c", "d"], 16) == TierResult(16, 0)
