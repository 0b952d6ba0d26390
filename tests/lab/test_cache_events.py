"""A cache model that reports itself through engine events: the index fed those events,
over the wire, ends holding exactly what the cache holds, copy for copy."""

from __future__ import annotations

import random

import pytest

from prefixgate.cache import PrefixCache
from prefixgate.events import ENCODINGS, ReplicaIndex, WireDecoder, content_keys, encode_batch
from prefixgate.lab.events.emitter import CacheEventEmitter

B = 8


def sessions_workload(rng: random.Random, turns: int = 60) -> list[tuple[list[int], list[int]]]:
    """(prompt, output) of agent-like sessions sharing a system prompt, interleaved."""
    system = [rng.randrange(1000) for _ in range(5 * B + 3)]
    histories = {s: system + [2000 + s] * (B + s) for s in range(5)}
    out = []
    for _ in range(turns):
        s = rng.randrange(5)
        prompt = histories[s] + [rng.randrange(1000) for _ in range(rng.randint(3, 2 * B))]
        output = [rng.randrange(1000) for _ in range(rng.randint(1, 2 * B))]
        out.append((prompt, output))
        histories[s] = prompt + output
    return out


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_index_follows_the_cache_model_exactly(encoding) -> None:
    rng = random.Random(7)
    emitter = CacheEventEmitter(B)
    cache = PrefixCache(
        B, capacity_tokens=30 * B, on_evict=emitter.evicted, on_store=emitter.stored
    )
    index, decoder = ReplicaIndex(), WireDecoder()

    def publish() -> None:
        payload = encode_batch(0.0, emitter.take(), encoding)
        index.apply(decoder.decode(payload).events)

    removals = 0
    for prompt, output in sessions_workload(rng):
        predicted = min(index.longest_prefix(content_keys(prompt, B)).gpu, (len(prompt) - 1) // B)
        assert predicted * B == cache.peek(prompt)
        lease = cache.begin(prompt)
        publish()
        assert lease.cached_tokens == predicted * B
        cache.end(lease, output_tokens=output)
        publish()
        assert index.resident() == cache.pool.copies()
        removals = index.counters.removed_blocks
    assert removals > 0 and cache.evicted_blocks == removals
    assert index.counters.orphan_blocks == index.counters.unknown_removals == 0


def test_the_engines_hash_seed_changes_the_wire_not_the_index() -> None:
    prompt = list(range(5 * B))
    indexes = []
    for seed in (1, 2):
        emitter = CacheEventEmitter(B, seed=seed)
        cache = PrefixCache(B, on_store=emitter.stored)
        cache.process(prompt)
        events = emitter.take()
        index = ReplicaIndex()
        index.apply(events)
        indexes.append((events[0].block_hashes, index.resident()))
    (hashes_a, held_a), (hashes_b, held_b) = indexes
    assert hashes_a != hashes_b
    assert held_a == held_b == {k: 1 for k in content_keys(prompt, B)}


def test_a_salted_prompt_is_held_but_never_predicted_for_another() -> None:
    emitter = CacheEventEmitter(B)
    cache = PrefixCache(B, on_store=emitter.stored)
    prompt = list(range(4 * B + 1))
    cache.process(prompt, salt="tenant-a")
    (stored,) = emitter.take()
    assert stored.extra_keys[0] == ["tenant-a"] and stored.extra_keys[1:] == [None] * 3
    index = ReplicaIndex()
    index.apply([stored])
    assert len(index) == 4
    assert index.longest_prefix(content_keys(prompt, B)).blocks == 0
