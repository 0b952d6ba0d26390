"""The KV block pool: refs, tail-first LRU, lazy eviction, capacity."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.cache.pool import BlockPool, Handle


def chain(name: str, n: int) -> list[str]:
    """Stand-in block hashes: the pool accepts any hashable key."""
    return [f"{name}{i}" for i in range(n)]


def test_longest_prefix_has_no_side_effects() -> None:
    pool = BlockPool(16, 16 * 8)
    pool.release(pool.acquire(chain("a", 3)))
    before = (pool.free_order(), pool.hit_blocks, pool.num_used_blocks)
    assert pool.longest_prefix(chain("a", 5)) == 3
    assert pool.longest_prefix(["x", *chain("a", 3)[1:]]) == 0
    assert pool.longest_prefix([]) == 0
    assert (pool.free_order(), pool.hit_blocks, pool.num_used_blocks) == before


def test_acquire_touches_hits_and_allocates_misses() -> None:
    pool = BlockPool(16)
    first = pool.acquire(chain("a", 3))
    assert (first.hit_blocks, first.num_hashed, pool.num_used_blocks) == (0, 3, 3)
    second = pool.acquire([*chain("a", 2), "b2"])
    assert second.hit_blocks == 2
    assert second.blocks[:2] == first.blocks[:2]  # shared blocks, refcount 2
    assert pool.num_used_blocks == 4
    pool.release(first)
    assert pool.free_order() == ["a2"]  # shared blocks are still referenced
    pool.release(second)
    assert pool.free_order() == ["a2", "b2", "a1", "a0"]
    assert pool.num_used_blocks == 0
    assert pool.hit_blocks == 2 and pool.allocated_blocks == 4


def test_release_is_tail_first() -> None:
    pool = BlockPool(16, 16 * 10)
    pool.release(pool.acquire(chain("a", 4)))
    assert pool.free_order() == ["a3", "a2", "a1", "a0"]


def test_hit_moves_blocks_to_the_back_of_the_queue() -> None:
    pool = BlockPool(16, 16 * 10)
    pool.release(pool.acquire(chain("a", 2)))
    pool.release(pool.acquire(chain("b", 2)))
    pool.release(pool.acquire(chain("a", 2)))
    assert pool.free_order() == ["b1", "b0", "a1", "a0"]


def test_chain_start_survives_longer_than_its_end() -> None:
    pool = BlockPool(16, 16 * 4)
    pool.release(pool.acquire(chain("a", 4)))
    pool.release(pool.acquire(chain("b", 1)))  # evicts the END of chain a
    assert pool.longest_prefix(chain("a", 4)) == 3
    pool.release(pool.acquire(chain("c", 2)))
    assert pool.longest_prefix(chain("a", 4)) == 1
    assert pool.evicted_blocks == 3


def test_lazy_eviction_freed_block_is_a_hit_until_reused() -> None:
    pool = BlockPool(16, 16 * 2)
    pool.release(pool.acquire(["a0"]))
    assert pool.num_used_blocks == 0 and "a0" in pool
    pool.release(pool.acquire(["b0"]))  # a never-used block is taken first
    assert "a0" in pool and "b0" in pool
    h = pool.acquire(["a0"])  # still a hit
    assert h.hit_blocks == 1
    pool.release(h)
    pool.release(pool.acquire(["c0"]))  # the LRU free block (b0) is reused
    assert "b0" not in pool and "a0" in pool and "c0" in pool


def test_blocks_in_use_are_never_evicted() -> None:
    pool = BlockPool(16, 16 * 3)
    held = pool.acquire(chain("a", 2))
    pool.release(pool.acquire(["b0"]))
    pool.release(pool.acquire(["c0"]))  # only b0's block is free: it is reused
    assert pool.longest_prefix(chain("a", 2)) == 2
    assert "b0" not in pool
    pool.release(held)


def test_capacity_rounds_down_and_is_honoured() -> None:
    pool = BlockPool(16, 16 * 4 + 15)
    assert pool.num_blocks == 4 and pool.capacity_tokens == 64
    for name in "abcdef":
        pool.release(pool.acquire(chain(name, 3)))
        assert pool.num_cached_blocks <= 4
    assert pool.num_free_blocks == 4 and pool.usage == 0.0


def test_request_larger_than_capacity_caches_what_fits() -> None:
    pool = BlockPool(16, 16 * 3)
    h = pool.acquire(chain("a", 5), extra_blocks=1)
    assert (h.num_hashed, h.complete, len(h.blocks)) == (3, False, 3)
    assert pool.usage == 1.0
    pool.extend(h, ["ignored"])  # a chain with a gap is not extended
    assert "ignored" not in pool
    pool.release(h)
    assert pool.longest_prefix(chain("a", 5)) == 3


def test_concurrent_requests_wait_for_nothing_but_get_what_is_free() -> None:
    pool = BlockPool(16, 16 * 2)
    a = pool.acquire(chain("a", 2))
    b = pool.acquire(chain("b", 2))
    assert (b.num_hashed, b.complete) == (0, False)
    pool.release(b)
    pool.release(a)


def test_capped_hit_recomputes_into_a_duplicate_block() -> None:
    pool = BlockPool(16, 16 * 8)
    pool.release(pool.acquire(chain("a", 4)))
    h = pool.acquire(chain("a", 4), max_hit_blocks=3)
    assert h.hit_blocks == 3
    assert pool.num_cached_blocks == 5  # a3 twice: vLLM does not de-duplicate
    pool.release(h)
    assert pool.free_order() == ["a3", "a3", "a2", "a1", "a0"]


def test_uncached_blocks_take_room_and_queue_position() -> None:
    pool = BlockPool(16, 16 * 3)
    pool.release(pool.acquire(["a0"], extra_blocks=1))  # a prompt of 1.5 blocks
    assert pool.free_order() == [None, "a0"]
    pool.release(pool.acquire(["b0", "b1"]))  # fresh block, then the uncached one
    assert "a0" in pool
    assert pool.evicted_blocks == 0


def test_extend_fills_held_uncached_blocks_first() -> None:
    pool = BlockPool(16, 16 * 4)
    h = pool.acquire(["a0"], extra_blocks=1)
    partial = h.blocks[1]
    pool.extend(h, ["a1"], extra_blocks=1)
    assert h.blocks[1] == partial and h.num_hashed == 2 and len(h.blocks) == 3
    pool.release(h)
    assert pool.free_order() == [None, "a1", "a0"]


def test_unlimited_pool_never_evicts_and_ignores_uncached_blocks() -> None:
    pool = BlockPool(16)
    for i in range(50):
        pool.release(pool.acquire(chain(f"r{i}-", 3), extra_blocks=1))
    assert pool.evicted_blocks == 0
    assert pool.num_cached_blocks == 150
    assert pool.num_free_blocks is None and pool.usage == 0.0


def test_release_twice_and_clear() -> None:
    pool = BlockPool(16, 64)
    h = pool.acquire(["a0"])
    with pytest.raises(RuntimeError):
        pool.clear()
    pool.release(h)
    with pytest.raises(ValueError):
        pool.release(h)
    with pytest.raises(ValueError):
        pool.extend(h, ["a1"])
    pool.clear()
    assert "a0" not in pool and pool.num_cached_blocks == 0


def test_on_evict_reports_dropped_hashes() -> None:
    evicted: list[Hashable] = []
    pool = BlockPool(16, 32, on_evict=evicted.append)
    pool.release(pool.acquire(chain("a", 2)))
    pool.release(pool.acquire(["b0"]))
    assert evicted == ["a1"]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        BlockPool(0)
    with pytest.raises(ValueError):
        BlockPool(16, -1)


# -- against a deliberately naive reference model ------------------------------------------


class NaivePool:
    """vLLM's rules written as plainly as possible: a list of blocks, a list as free queue."""

    def __init__(self, num_blocks: int) -> None:
        self.hash: list[Hashable | None] = [None] * num_blocks
        self.ref = [0] * num_blocks
        self.free = list(range(num_blocks))  # vLLM's initial queue: every block, in order
        self.stamp: dict[int, int] = {}  # block -> when it got its hash
        self.clock = 0

    def lookup(self, h: Hashable) -> int | None:
        # the oldest copy: lowest insertion stamp
        holders = [b for b in range(len(self.hash)) if self.hash[b] == h]
        return min(holders, key=lambda b: self.stamp[b]) if holders else None

    def acquire(self, hashes: list[str], cap: int) -> tuple[int, list[int]]:
        hit = 0
        while hit < min(cap, len(hashes)) and self.lookup(hashes[hit]) is not None:
            hit += 1
        blocks = []
        for h in hashes[:hit]:
            b = self.lookup(h)
            assert b is not None
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
            blocks.append(b)
        for h in hashes[hit:]:
            if not self.free:
                break
            b = self.free.pop(0)
            self.ref[b] = 1
            self.hash[b] = h
            self.clock += 1
            self.stamp[b] = self.clock
            blocks.append(b)
        return hit, blocks

    def release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)


requests = st.lists(
    st.tuples(
        st.sampled_from("abc"),  # which conversation
        st.integers(min_value=1, max_value=6),  # its length in blocks
        st.integers(min_value=0, max_value=6),  # hit cap (the last-token rule)
        st.booleans(),  # keep it running (released later) or finish now
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(requests, st.integers(min_value=1, max_value=10))
def test_matches_naive_reference(reqs: list[tuple[str, int, int, bool]], capacity: int) -> None:
    pool, ref = BlockPool(1, capacity), NaivePool(capacity)
    running: list[tuple[Handle, list[int]]] = []
    for name, n, cap, keep in reqs:
        hashes = chain(name, n)
        handle = pool.acquire(hashes, max_hit_blocks=cap)
        hit, blocks = ref.acquire(hashes, cap)
        assert handle.hit_blocks == hit
        assert len(handle.blocks) == len(blocks)
        running.append((handle, blocks))
        if not keep or len(running) > 2:
            h, b = running.pop(0)
            pool.release(h)
            ref.release(b)
        assert pool.free_order() == [ref.hash[b] for b in ref.free if ref.hash[b] is not None]
    for h, b in running:
        pool.release(h)
        ref.release(b)
    for name in "abc":
        expect = 0
        while expect < 6 and ref.lookup(f"{name}{expect}") is not None:
            expect += 1
        assert pool.longest_prefix(chain(name, 6)) == expect


def _state(pool: BlockPool) -> tuple:
    return (
        pool._key,
        pool._ref,
        pool._cached,
        [*pool._free, *(b for run in pool._runs for b in reversed(run.blocks))],  # the queue
        pool._used,
        pool._num_cached,
        pool.hit_blocks,
        pool.allocated_blocks,
        pool.evicted_blocks,
    )


processes = st.lists(
    st.tuples(
        st.lists(st.sampled_from("abcdef"), max_size=8),  # the prompt's block hashes
        st.integers(min_value=0, max_value=9),  # hit cap (the last-token rule)
        st.integers(min_value=0, max_value=2),  # uncached blocks (the partial one)
        st.integers(min_value=0, max_value=3),  # 0: processed; else held this many more steps
        st.booleans(),  # the very hash objects of earlier prompts (else equal ones)
    ),
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(processes, st.one_of(st.none(), st.integers(min_value=0, max_value=12)))
def test_process_leaves_the_pool_as_acquire_and_release_do(reqs, capacity) -> None:
    """``process`` against ``acquire`` then ``release``, on prompts that share prefixes,
    repeat a hash, outgrow the pool, and beside requests that hold their blocks."""
    evicted: tuple[list, list] = ([], [])
    fast = BlockPool(1, capacity, on_evict=evicted[0].append)
    slow = BlockPool(1, capacity, on_evict=evicted[1].append)
    held: list[tuple[int, Handle, Handle]] = []
    seen: dict[str, str] = {}
    for letters, cap, extra, hold, same in reqs:
        hashes = ["".join(letters[: i + 1]) for i in range(len(letters))]  # a chain
        hashes += letters[len(letters) // 2 :]  # and blocks that may repeat a hash
        if same:
            hashes = [seen.setdefault(h, h) for h in hashes]
        if hold:
            a = fast.acquire(hashes, max_hit_blocks=cap, extra_blocks=extra)
            b = slow.acquire(hashes, max_hit_blocks=cap, extra_blocks=extra)
            assert a.blocks == b.blocks
            held.append((hold, a, b))
        else:
            handle = slow.acquire(hashes, max_hit_blocks=cap, extra_blocks=extra)
            slow.release(handle)
            assert fast.process(hashes, max_hit_blocks=cap, extra_blocks=extra) == (
                handle.hit_blocks
            )
        for step in list(held):
            held.remove(step)
            if step[0] == 1:
                fast.release(step[1])
                slow.release(step[2])
            else:
                held.append((step[0] - 1, step[1], step[2]))
        assert _state(fast) == _state(slow)
        assert evicted[0] == evicted[1]
