"""Chained block hashes: full blocks only, the chain property, salts, the last-token cap."""

from __future__ import annotations

from hashlib import blake2b

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.cache.blocks import (
    ROOT_SEED,
    chain_seed,
    hash_blocks,
    hit_tokens_cap,
    num_blocks,
    num_full_blocks,
)

token_lists = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=200)


def test_full_blocks_only() -> None:
    assert hash_blocks(list(range(15)), 16) == []
    assert len(hash_blocks(list(range(16)), 16)) == 1
    assert len(hash_blocks(list(range(47)), 16)) == 2
    assert len(hash_blocks(list(range(48)), 16)) == 3
    assert hash_blocks([], 16) == []


def test_hashes_are_16_bytes_and_follow_the_documented_formula() -> None:
    tokens = list(range(32))
    h = hash_blocks(tokens, 16)
    assert all(isinstance(x, bytes) and len(x) == 16 for x in h)
    raw = np.asarray(tokens, dtype="<i8").tobytes()
    h0 = blake2b(ROOT_SEED + raw[:128], digest_size=16).digest()
    h1 = blake2b(h0 + raw[128:], digest_size=16).digest()
    assert h == [h0, h1]


def test_partial_last_block_does_not_change_full_hashes() -> None:
    assert hash_blocks(list(range(40)), 16) == hash_blocks(list(range(32)), 16)


def test_list_and_array_inputs_agree() -> None:
    tokens = [0, 1, 2**31, 2**32 - 1] * 8
    expect = hash_blocks(tokens, 16)
    assert hash_blocks(np.array(tokens, dtype=np.uint32), 16) == expect
    assert hash_blocks(np.array(tokens, dtype=np.int64), 16) == expect
    assert hash_blocks(tuple(tokens), 16) == expect


def test_change_in_block_k_changes_every_hash_from_k() -> None:
    base = list(range(16 * 6))
    for k in range(6):
        changed = list(base)
        changed[k * 16 + 5] += 1
        a, b = hash_blocks(base, 16), hash_blocks(changed, 16)
        assert a[:k] == b[:k]
        assert all(x != y for x, y in zip(a[k:], b[k:], strict=True))


@settings(deadline=None)
@given(token_lists, st.integers(min_value=0, max_value=199), st.sampled_from([1, 2, 4, 16]))
def test_chain_property(tokens: list[int], pos: int, block_size: int) -> None:
    """Changing token ``pos`` keeps exactly the hashes of the blocks before its block."""
    if not tokens:
        return
    pos %= len(tokens)
    changed = list(tokens)
    changed[pos] = (changed[pos] + 1) % 2**32
    a, b = hash_blocks(tokens, block_size), hash_blocks(changed, block_size)
    k = pos // block_size
    assert a[:k] == b[:k]
    assert all(x != y for x, y in zip(a[k:], b[k:], strict=True))


@settings(deadline=None)
@given(token_lists, token_lists)
def test_shared_prefix_shares_full_block_hashes(prefix: list[int], rest: list[int]) -> None:
    a, b = hash_blocks(prefix, 4), hash_blocks(prefix + rest, 4)
    assert b[: len(a)] == a


def test_salt_isolation() -> None:
    tokens = list(range(64))
    plain, s1, s2 = (hash_blocks(tokens, 16, salt=s) for s in (None, "tenant-a", "tenant-b"))
    assert hash_blocks(tokens, 16, salt="tenant-a") == s1
    assert not set(plain) & set(s1)
    assert not set(s1) & set(s2)
    assert chain_seed(None) == ROOT_SEED != chain_seed("")


def test_parent_continues_a_chain() -> None:
    tokens = list(range(80))
    whole = hash_blocks(tokens, 16, salt="s")
    head = hash_blocks(tokens[:32], 16, salt="s")
    tail = hash_blocks(tokens[32:], 16, parent=head[-1])
    assert head + tail == whole
    as_int = int.from_bytes(head[-1], "little")
    assert hash_blocks(tokens[32:], 16, parent=as_int) == tail


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        hash_blocks([1, 2], 0)
    with pytest.raises(ValueError):
        hash_blocks([1, 2], 1, salt="s", parent=b"x" * 16)
    with pytest.raises(ValueError):
        hash_blocks([[1, 2]], 1)
    with pytest.raises(TypeError):
        hash_blocks([1, 2], 1, parent="abc")  # type: ignore[arg-type]


def test_block_sizes_do_not_collide() -> None:
    tokens = list(range(64))
    assert not set(hash_blocks(tokens, 16)) & set(hash_blocks(tokens, 32))


def test_hit_tokens_cap_last_token_rule() -> None:
    assert hit_tokens_cap(64, 16) == 48
    assert hit_tokens_cap(65, 16) == 64
    assert hit_tokens_cap(16, 16) == 0
    assert hit_tokens_cap(17, 16) == 16
    assert hit_tokens_cap(1, 16) == 0
    assert hit_tokens_cap(0, 16) == 0
    assert hit_tokens_cap(1024, 256) == 768


def test_block_counts() -> None:
    assert (num_full_blocks(47, 16), num_blocks(47, 16)) == (2, 3)
    assert (num_full_blocks(48, 16), num_blocks(48, 16)) == (3, 3)
    assert (num_full_blocks(0, 16), num_blocks(0, 16)) == (0, 0)
