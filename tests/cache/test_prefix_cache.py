"""PrefixCache: vLLM's hit rule, the request lifecycle, output blocks, counters."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import prefixgate.cache as cache_pkg
from prefixgate.cache import CacheResult, PrefixCache, hash_blocks


def toks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_public_surface() -> None:
    assert sorted(cache_pkg.__all__) == [
        "ApproxTokenizer",
        "BlockHash",
        "BlockPool",
        "CacheResult",
        "ChatRenderer",
        "HFTokenizer",
        "Handle",
        "JinjaChatTemplate",
        "Lease",
        "PrefixCache",
        "RemoteTokenizer",
        "RenderError",
        "Renderer",
        "StoredBlocks",
        "Tokenizer",
        "TokenizerError",
        "canonical_json",
        "chain_seed",
        "get_tokenizer",
        "hash_blocks",
        "hit_tokens_cap",
        "num_blocks",
        "num_full_blocks",
        "render_tokens",
    ]


def test_last_token_rule() -> None:
    pc = PrefixCache(16)
    assert pc.process(toks(64)) == CacheResult(64, 0)
    assert pc.process(toks(64)) == CacheResult(64, 48)
    assert pc.process(toks(65)) == CacheResult(65, 64)
    assert pc.process(toks(100)) == CacheResult(100, 64)  # block 5 was never full before
    assert pc.process(toks(100)) == CacheResult(100, 96)


def test_tiny_prompts() -> None:
    pc = PrefixCache(16)
    for n in (0, 1, 15, 16):
        pc.process(toks(n))
        assert pc.process(toks(n)).cached_tokens == 0
    assert pc.process(toks(17)).cached_tokens == 16


def test_peek_has_no_side_effects() -> None:
    pc = PrefixCache(16, capacity_tokens=16 * 4)
    pc.process(toks(64))
    order = pc.pool.free_order()
    counters = (pc.requests, pc.queries, pc.hits)
    assert pc.peek(toks(64)) == 48
    assert pc.peek(toks(80)) == 64
    assert pc.peek(toks(80, start=1)) == 0
    assert pc.pool.free_order() == order
    assert (pc.requests, pc.queries, pc.hits) == counters


def test_divergence_caps_the_hit_at_the_changed_block() -> None:
    pc = PrefixCache(16)
    base = toks(160)
    pc.process(base)
    for k in range(9):
        changed = list(base)
        changed[k * 16 + 3] = -1
        assert pc.peek(changed) == k * 16


@settings(deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=1000), min_size=2, max_size=120),
    st.integers(min_value=0),
    st.sampled_from([1, 4, 16]),
)
def test_chain_property_through_the_cache(tokens: list[int], pos: int, bs: int) -> None:
    pc = PrefixCache(bs)
    pc.process(tokens)
    pos %= len(tokens)
    changed = list(tokens)
    changed[pos] += 1
    cap = (len(tokens) - 1) // bs
    assert pc.peek(changed) == min(pos // bs, cap) * bs


def test_salt_isolation() -> None:
    pc = PrefixCache(16)
    pc.process(toks(64), salt="a")
    assert pc.peek(toks(64), salt="b") == 0
    assert pc.peek(toks(64)) == 0
    assert pc.peek(toks(64), salt="a") == 48
    tenant = PrefixCache(16, salt="a")
    tenant.process(toks(64))
    assert tenant.peek(toks(64)) == 48
    assert tenant.peek(toks(64), salt="b") == 0


def test_counters() -> None:
    pc = PrefixCache(16)
    pc.process(toks(64))
    pc.process(toks(64))
    assert (pc.requests, pc.queries, pc.hits) == (2, 128, 48)
    assert pc.hit_rate == 48 / 128
    assert PrefixCache().hit_rate == 0.0


def test_leases_protect_blocks_of_running_requests() -> None:
    pc = PrefixCache(16, capacity_tokens=16 * 6)
    running = pc.begin(toks(64))
    assert pc.usage == 4 / 6
    other = pc.process(toks(64, start=1000))  # needs 4 blocks, only 2 are free
    assert other == CacheResult(64, 0)
    assert pc.peek(toks(65)) == 64
    pc.end(running)
    assert pc.usage == 0.0
    assert pc.evicted_blocks == 0
    pc.process(toks(64, start=2000))  # free queue: b1 b0 a3 a2 a1 a0 -> takes 4
    assert pc.evicted_blocks == 4
    assert pc.evicted_tokens == 64
    assert pc.peek(toks(65)) == 32


def test_concurrent_identical_requests_share_blocks() -> None:
    pc = PrefixCache(16)
    a = pc.begin(toks(65))
    b = pc.begin(toks(65))  # vLLM v1 caches blocks at allocation: b hits a's blocks
    assert (a.cached_tokens, b.cached_tokens) == (0, 64)
    pc.end(a)
    pc.end(b)
    with pytest.raises(ValueError):
        pc.end(b)


def test_lru_eviction_prefers_chain_ends() -> None:
    pc = PrefixCache(16, capacity_tokens=16 * 8)
    pc.process(toks(16 * 4 + 1, start=0))  # 4 full blocks + a partial one
    pc.process(toks(16 * 4 + 1, start=500))
    # 8 full blocks + 2 partials do not fit: the second request reused the first's
    # partial block and then the LRU free block, which was the END of the first chain
    assert pc.peek(toks(16 * 4 + 1, start=0)) == 48
    assert pc.peek(toks(16 * 4 + 1, start=500)) == 64


def test_output_tokens_extend_the_chain() -> None:
    pc = PrefixCache(16)
    prompt = toks(40)
    answer = toks(30, start=9000)
    lease = pc.begin(prompt)
    pc.end(lease, output_tokens=answer)
    # computed: 40 + 29 = 69 tokens -> 4 full blocks cached
    follow_up = prompt + answer + toks(20, start=5000)
    assert pc.peek(follow_up) == 64
    assert hash_blocks(prompt + answer[:-1], 16) == [
        *hash_blocks(prompt, 16),
        *hash_blocks(prompt[32:] + answer[:-1], 16, parent=hash_blocks(prompt, 16)[-1]),
    ]


def test_output_tokens_short_prompt_and_salt() -> None:
    pc = PrefixCache(16)
    pc.end(pc.begin(toks(5), salt="s"), output_tokens=toks(40, start=100))
    follow_up = toks(5) + toks(40, start=100)
    assert pc.peek(follow_up, salt="s") == 32
    assert pc.peek(follow_up) == 0


def test_output_tokens_in_a_bounded_pool_fill_the_partial_block() -> None:
    pc = PrefixCache(16, capacity_tokens=16 * 3)
    lease = pc.begin(toks(20))  # 1 full + 1 partial block
    pc.end(lease, output_tokens=toks(30, start=100))  # 49 computed tokens: 3 full, 4 needed
    assert pc.peek(toks(20) + toks(30, start=100)) == 48
    assert pc.pool.num_cached_blocks == 3


def test_block_leases_from_trace_ids() -> None:
    pc = PrefixCache(block_size=512)
    # Mooncake-style: one id per 512-token block, the last (partial) one included
    assert pc.process_blocks([1, 2, 3], 1400) == CacheResult(1400, 0)
    assert pc.process_blocks([1, 2, 9], 1400) == CacheResult(1400, 1024)
    assert pc.peek_blocks([1, 2, 3], 1024) == 512  # last-token rule
    lease = pc.begin_blocks([1, 2], 1024)
    with pytest.raises(ValueError):
        pc.end(lease, output_tokens=[1, 2, 3])
    pc.end(lease)


def test_numpy_tokens() -> None:
    pc = PrefixCache(16)
    arr = np.arange(100, dtype=np.uint32)
    pc.end(pc.begin(arr), output_tokens=np.arange(50, dtype=np.uint32))
    assert pc.peek(arr) == 96
    assert pc.peek(list(range(100))) == 96


def test_reset() -> None:
    pc = PrefixCache(16)
    pc.process(toks(64))
    pc.reset()
    assert pc.peek(toks(64)) == 0
    assert pc.requests == 1


def test_long_prompt() -> None:
    rng = random.Random(7)
    prompt = [rng.randrange(150_000) for _ in range(100_000)]
    pc = PrefixCache(16)
    assert pc.process(prompt).cached_tokens == 0
    assert pc.process(prompt).cached_tokens == 99_984


def test_threads_share_one_cache() -> None:
    pc = PrefixCache(16, capacity_tokens=16 * 64)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            rng = random.Random(seed)
            for _ in range(50):
                n = rng.randrange(1, 200)
                pc.process(toks(n, start=rng.choice([0, 1000])))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert pc.requests == 200
    assert pc.pool.num_used_blocks == 0
    assert pc.pool.num_cached_blocks <= 64
