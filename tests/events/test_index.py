"""The index after stored / removed / cleared events: keyed by content, per medium."""

from __future__ import annotations

import random

import pytest

from prefixgate.cache import PrefixCache, hash_blocks
from prefixgate.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventIndex,
    ReplicaIndex,
    content_keys,
)

B = 4
TOKENS = list(range(100, 124))  # six blocks of four
KEYS = content_keys(TOKENS, B)


def stored(hashes, parent, tokens, medium="GPU", **kw) -> BlockStored:
    return BlockStored(list(hashes), parent, list(tokens), B, medium=medium, **kw)


def engine_events(tokens, seed: int, per_event: int = 2) -> tuple[list[int], list[BlockStored]]:
    """The stores an engine with hash seed ``seed`` sends for ``tokens``, a few blocks a
    time, chained by its own (seeded) hashes."""
    rng = random.Random(seed)
    hashes = [rng.getrandbits(64) for _ in range(len(tokens) // B)]
    events, parent = [], None
    for i in range(0, len(hashes), per_event):
        chunk = hashes[i : i + per_event]
        events.append(stored(chunk, parent, tokens[i * B : (i + len(chunk)) * B]))
        parent = chunk[-1]
    return hashes, events


def test_content_keys_are_the_cache_models_hashes() -> None:
    """One truth about block hashing: the cache model's keys are the index's keys."""
    cache = PrefixCache(block_size=B)
    assert KEYS == cache.hash(TOKENS) == hash_blocks(TOKENS, B)
    assert len(content_keys(TOKENS + [1, 2, 3], B)) == 6  # a partial block has no key
    assert content_keys(TOKENS[:3], B) == []


def test_the_engines_hash_seed_does_not_matter() -> None:
    idx = EventIndex()
    for replica, seed in (("a", 1), ("b", 2)):
        _, events = engine_events(TOKENS, seed)
        idx.apply(replica, events)
    for replica in ("a", "b"):
        hit = idx.longest_prefix(replica, KEYS)
        assert (hit.blocks, hit.gpu) == (6, 6)
        assert set(idx.replica(replica).resident()) == set(KEYS)
    other = content_keys([7] + TOKENS[1:], B)  # the first token differs: nothing matches
    assert idx.longest_prefix("a", other).blocks == 0
    assert idx.longest_prefix("nobody", KEYS).blocks == 0


def test_removed_blocks_end_the_prefix_there() -> None:
    idx = ReplicaIndex()
    hashes, events = engine_events(TOKENS, 3)
    idx.apply(events)
    idx.apply([BlockRemoved([hashes[2]], "GPU")])
    assert idx.longest_prefix(KEYS).blocks == 2
    assert idx.longest_prefix(KEYS[3:]).blocks == 3  # what follows is still held
    idx.apply([BlockRemoved(hashes[3:], "GPU")])
    assert idx.resident() == {k: 1 for k in KEYS[:2]}
    assert idx.counters.removed_blocks == 4
    idx.apply([BlockRemoved([hashes[2], 12345], "GPU")])  # gone already / never known
    assert idx.counters.unknown_removals == 2


def test_all_blocks_cleared() -> None:
    idx = ReplicaIndex()
    idx.apply(engine_events(TOKENS, 4)[1])
    idx.apply([AllBlocksCleared()])
    assert idx.longest_prefix(KEYS).blocks == 0 and len(idx) == 0
    assert idx.counters.clears == 1
    idx.apply(engine_events(TOKENS, 5)[1])  # stores after the clear count again
    assert idx.longest_prefix(KEYS).blocks == 6


def test_a_block_stored_twice_needs_two_removals() -> None:
    """vLLM recomputes a cached block under the last-token rule and announces the copy."""
    idx = ReplicaIndex()
    hashes, events = engine_events(TOKENS, 6)
    idx.apply(events)
    idx.apply([stored([hashes[5]], hashes[4], TOKENS[20:24])])
    idx.apply([BlockRemoved([hashes[5]], "GPU")])
    assert idx.longest_prefix(KEYS).blocks == 6
    idx.apply([BlockRemoved([hashes[5]], "GPU")])
    assert idx.longest_prefix(KEYS).blocks == 5


def test_a_parent_never_seen_makes_orphans() -> None:
    idx = ReplicaIndex()
    hashes, events = engine_events(TOKENS, 7)
    idx.apply(events[1:])  # joined after the first store
    assert len(idx) == 0
    assert idx.counters.orphan_blocks == 4  # the second event's two and the third's two
    idx.apply(events[:1])
    assert idx.longest_prefix(KEYS).blocks == 2


def test_host_tier_blocks_continue_a_gpu_prefix() -> None:
    """The OffloadingConnector's host stores name known blocks and carry no tokens."""
    idx = ReplicaIndex()
    hashes, events = engine_events(TOKENS, 8)
    idx.apply(events)
    idx.apply([BlockStored(hashes, None, [], 0, medium="CPU")])
    idx.apply([BlockRemoved(hashes[2:], "GPU")])  # evicted from the GPU, kept in host memory
    hit = idx.longest_prefix(KEYS)
    assert hit.by_medium == {"GPU": 2, "CPU": 6}
    assert hit.blocks == 6
    idx.apply([BlockRemoved(hashes[4:5], "CPU")])
    hit = idx.longest_prefix(KEYS)
    assert (hit.gpu, hit.by_medium["CPU"], hit.blocks) == (2, 4, 4)
    idx.apply([BlockStored([999], None, [], 0, medium="CPU")])  # a hash never stored
    assert idx.counters.orphan_blocks == 1


def test_another_block_size_is_refused_and_said() -> None:
    idx = ReplicaIndex(block_size=16)
    idx.apply(engine_events(TOKENS, 9)[1])
    assert len(idx) == 0
    assert idx.counters.size_mismatch_blocks == 6
    assert idx.block_size_error and "4" in idx.block_size_error and "16" in idx.block_size_error


def test_the_channel_learns_its_block_size_from_the_first_store() -> None:
    idx = EventIndex()
    assert idx.block_size is None and idx.content_keys(TOKENS) == []
    idx.apply("a", engine_events(TOKENS, 10)[1])
    assert idx.block_size == B
    assert idx.content_keys(TOKENS) == KEYS
    idx.apply("b", [BlockStored([1], None, list(range(8)), 8)])  # another replica, other size
    assert idx.replica("b").block_size_error is not None
    assert len(idx.replica("b")) == 0


def test_token_ids_that_do_not_fill_the_blocks() -> None:
    idx = ReplicaIndex()
    idx.apply([stored([1, 2], None, TOKENS[:7])])
    assert len(idx) == 0 and idx.counters.malformed_events == 1


def test_lora_and_extra_keys_never_match_plain_tokens() -> None:
    idx = ReplicaIndex()
    idx.apply([stored([1, 2], None, TOKENS[:8], lora_name="adapter")])
    idx.apply([stored([3], 2, TOKENS[8:12])])  # chained after a LoRA block: LoRA's too
    idx.apply([stored([4, 5], None, TOKENS[:8], extra_keys=[["salt"], None])])
    idx.apply([stored([6, 7], None, TOKENS[:8], extra_keys=[None, None])])  # nothing extra
    assert len(idx) == 7
    assert idx.longest_prefix(KEYS).blocks == 2  # only the plain blocks 6 and 7


def test_other_kv_cache_groups_are_skipped() -> None:
    idx = ReplicaIndex()
    idx.apply([stored([1, 2], None, TOKENS[:8], group_idx=1)])
    idx.apply([BlockRemoved([1], "GPU", group_idx=1)])
    assert len(idx) == 0 and idx.counters.skipped_group_blocks == 3


def test_memory_is_bounded() -> None:
    idx = ReplicaIndex(max_blocks=10)
    rng = random.Random(11)
    for n in range(50):
        tokens = [rng.randrange(1000) for _ in range(3 * B)]
        idx.apply([stored([3 * n, 3 * n + 1, 3 * n + 2], None, tokens)])
    assert len(idx) == 10
    assert len(idx._by_hash) <= 20
    assert idx.counters.dropped == 150 - 10 + 150 - 20


def test_a_lookup_keeps_its_blocks_in_the_lru() -> None:
    """Two indexes get the same stores; lookups in one of them touch the blocks they find."""
    touched, untouched = ReplicaIndex(max_blocks=8), ReplicaIndex(max_blocks=8)
    _, first = engine_events(TOKENS[:8], 12)  # two blocks, stored first
    rng = random.Random(13)
    later = [
        [stored([100 + 2 * n, 101 + 2 * n], None, rng.sample(range(1000), 2 * B))] for n in range(7)
    ]
    for idx in (touched, untouched):
        idx.apply(first)
    for n, events in enumerate(later):
        for idx in (touched, untouched):
            idx.apply(events)
        if n < 3:
            touched.longest_prefix(KEYS[:2])
        if n == 3:  # ten stored for eight places: the two least recently used went
            assert untouched.longest_prefix(KEYS[:2], touch=False).blocks == 0
            assert touched.longest_prefix(KEYS[:2], touch=False).blocks == 2
    assert touched.longest_prefix(KEYS[:2], touch=False).blocks == 0  # not used since


@pytest.mark.parametrize("per_event", [1, 3, 6])
def test_the_split_into_events_does_not_matter(per_event) -> None:
    idx = ReplicaIndex()
    idx.apply(engine_events(TOKENS, 14, per_event)[1])
    assert set(idx.resident()) == set(KEYS)
