"""The index remembers when blocks came and went: a past time's state, for the ledger."""

from __future__ import annotations

import pytest

from prefixgate.events import AllBlocksCleared, BlockRemoved, EventIndex
from prefixgate.events.history import BlockHistory

from .test_index import KEYS, TOKENS, engine_events, stored


def _stored_then_removed(seed: int, first_removed: int, stored: float, removed: float):
    """The index, the engine's hashes and replica ``a``: every block stored at
    ``stored``, those from ``first_removed`` on removed at ``removed``."""
    idx = EventIndex()
    hashes, events = engine_events(TOKENS, seed=seed)
    idx.apply("a", events, now=stored)
    idx.apply("a", [BlockRemoved(hashes[first_removed:], medium="GPU")], now=removed)
    return idx, hashes, idx.replica("a")


def test_a_block_is_resident_between_its_store_and_its_removal() -> None:
    idx, hashes, r = _stored_then_removed(1, 4, 100.0, 200.0)
    assert r.history.covers(100.0) and not r.history.covers(99.0)
    before = r.blocks_at(KEYS, 150.0)
    assert [b.gpu for b in before] == [True] * 6
    assert [b.removed_at for b in before] == [None] * 4 + [200.0] * 2
    after = r.blocks_at(KEYS, 250.0)
    assert [b.held for b in after] == [True] * 4 + [False] * 2
    assert after[5].removed_at == 200.0  # removed before 250: evicted
    # stored again later: at 250 it was still gone, at 350 it is back
    idx.apply("a", [stored(hashes[4:], hashes[3], TOKENS[16:])], now=300.0)
    assert [b.held for b in r.blocks_at(KEYS, 250.0)] == [True] * 4 + [False] * 2
    assert [b.held for b in r.blocks_at(KEYS, 350.0)] == [True] * 6
    assert [b.held for b in r.blocks_at(KEYS, 150.0)] == [True] * 6  # the first residency


def test_a_block_stored_after_the_time_asked_was_not_there() -> None:
    idx = EventIndex()
    _, events = engine_events(TOKENS, seed=2)
    idx.apply("a", events[:1], now=10.0)
    idx.apply("a", events[1:], now=20.0)
    at = idx.replica("a").blocks_at(KEYS, 15.0)
    assert [b.held for b in at] == [True] * 2 + [False] * 4
    assert all(b.removed_at is None for b in at)


def test_host_tier_and_clears() -> None:
    idx = EventIndex()
    hashes, events = engine_events(TOKENS, seed=3)
    idx.apply("a", events, now=1.0)
    idx.apply("a", [stored(hashes[:2], None, [], medium="CPU")], now=2.0)
    idx.apply("a", [BlockRemoved(hashes, medium="GPU")], now=3.0)
    at = idx.replica("a").blocks_at(KEYS, 4.0)
    assert [(b.gpu, b.host) for b in at] == [(False, True)] * 2 + [(False, False)] * 4
    idx.apply("a", [AllBlocksCleared()], now=5.0)
    at = idx.replica("a").blocks_at(KEYS, 6.0)
    assert not any(b.held for b in at) and at[0].removed_at == 5.0
    assert idx.replica("a").blocks_at(KEYS, 2.5)[0].host  # still answerable for the past


def test_a_removal_by_a_cache_clear_is_told_from_an_eviction() -> None:
    idx, hashes, r = _stored_then_removed(5, 4, 1.0, 2.0)  # blocks 4, 5 evicted at 2
    idx.apply("a", [AllBlocksCleared()], now=3.0)  # blocks 0-3 cleared at 3
    at = r.blocks_at(KEYS, 4.0)
    assert [b.removed_at for b in at] == [3.0] * 4 + [2.0] * 2
    assert [b.cleared for b in at] == [True] * 4 + [False] * 2
    # stored again and evicted later: the latest removal is an eviction
    idx.apply("a", [stored(hashes[:1], None, TOKENS[:4])], now=5.0)
    idx.apply("a", [BlockRemoved(hashes[:1], medium="GPU")], now=6.0)
    first = r.blocks_at(KEYS, 7.0)[0]
    assert (first.removed_at, first.cleared) == (6.0, False)
    assert r.blocks_at(KEYS, 4.0)[0].cleared  # at 4, its removal was the clear
    idx.clear("a")  # the stream lost: the clears are forgotten with the rest
    assert not r.history.clears


def test_clear_times_are_bounded() -> None:
    h = BlockHistory(max_clears=2)
    for t in (1.0, 2.0, 3.0):
        h.cleared({}, t)
    assert list(h.clears) == [2.0, 3.0] and not h.was_clear(1.0) and h.was_clear(3.0)
    with pytest.raises(ValueError):
        BlockHistory(max_clears=0)


def test_losing_the_stream_forgets_the_history() -> None:
    idx = EventIndex()
    _, events = engine_events(TOKENS, seed=4)
    idx.apply("a", events, now=1.0)
    idx.clear("a")
    assert not idx.replica("a").history.covers(2.0)
    idx.apply("a", events, now=3.0)
    assert idx.replica("a").history.covers(3.0) and not idx.replica("a").history.covers(2.0)


def test_removals_are_bounded() -> None:
    h = BlockHistory(max_removals=3)
    for i in range(10):
        h.stored("GPU", [bytes([i])], float(i))
        h.removed("GPU", bytes([i]), float(i) + 0.5)
    assert h.sizes() == {"GPU": 3} and h.forgotten == 7
    assert h.at("GPU", bytes([9]), 9.2, False) == (True, 9.5)
    assert h.at("GPU", bytes([0]), 0.2, False) == (False, None)  # forgotten: reads as unseen
    with pytest.raises(ValueError):
        BlockHistory(0)


def test_a_block_that_came_and_went_twice_is_judged_at_each_time() -> None:
    h = BlockHistory()
    k = b"k"
    h.stored("GPU", [k], 1.0)
    h.removed("GPU", k, 2.0)
    h.stored("GPU", [k], 3.0)
    h.removed("GPU", k, 4.0)
    h.stored("GPU", [k], 5.0)
    assert h.at("GPU", k, 1.5, True) == (True, 2.0)  # a ledger computed late still sees it
    assert h.at("GPU", k, 2.5, True) == (False, 2.0)  # removed before: evicted
    assert h.at("GPU", k, 3.5, True) == (True, 4.0)
    assert h.at("GPU", k, 4.5, True) == (False, 4.0)
    assert h.at("GPU", k, 5.5, True) == (True, None)
    assert h.at("GPU", k, 0.5, True) == (False, 4.0)  # before it was ever stored


def test_blocks_never_held_answer_like_their_history() -> None:
    """The one-medium shortcut for a block never held gives what the history says."""
    _, _, r = _stored_then_removed(3, 5, 10.0, 20.0)
    unseen = [bytes([i]) * 16 for i in range(3)]
    at = r.blocks_at([*KEYS, *unseen], 30.0)
    want = [r.history.at("GPU", k, 30.0, k in r._media.get("GPU", {})) for k in [*KEYS, *unseen]]
    assert [(b.gpu, b.removed_at) for b in at] == want
    assert [b.held for b in at] == [True] * 5 + [False] * 4
    assert at[5].removed_at == 20.0 and all(b.removed_at is None for b in at[6:])
