"""The split: every prompt token gets exactly one cause, by the rules of ledger/split.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.events.history import BlockAt
from prefixgate.ledger import CAUSES
from prefixgate.ledger.split import split_events, split_model

B = 16
HELD, GONE, NEVER = (
    BlockAt(True, False, None),
    BlockAt(False, False, 5.0),
    BlockAt(False, False, None),
)
T, T_END = 10.0, 12.0


def events(L, cached, mine, others=None, previous=None, changed=False):
    return split_events(
        prompt_tokens=L,
        block_size=B,
        cached=cached,
        mine=mine,
        others=others or {},
        t=T,
        t_end=T_END,
        previous_tokens=previous,
        changed=changed,
    )


def test_a_full_hit_leaves_only_the_partial_block() -> None:
    s = events(100, 96, [HELD] * 6)
    assert s.parts == {"hit": 96, "partial_block": 4} and s.index_predicted == 96
    # a prompt of whole blocks: the last one is recomputed all the same (the last token)
    s = events(96, 80, [HELD] * 6)
    assert s.parts == {"hit": 80, "partial_block": 16} and s.index_predicted == 80


def test_each_cause() -> None:
    mine = [HELD, HELD, GONE, GONE, NEVER, NEVER, NEVER, NEVER, NEVER]
    others = {"b": [HELD] * 5 + [NEVER] * 4, "c": [NEVER] * 9}
    s = events(150, 32, mine, others, previous=112, changed=True)
    assert s.parts == {
        "hit": 32,
        "evicted": 32,
        "elsewhere": 16,
        "prefix_changed": 32,  # blocks 5 and 6: within the previous prompt (7 blocks)
        "cold": 32,
        "partial_block": 6,
    }
    assert s.elsewhere_replica == "b" and s.index_predicted == 32
    # the same prompt appended to an unchanged previous one: new blocks are cold
    s = events(150, 32, mine, others, previous=112, changed=False)
    assert s.parts["cold"] == 64 and "prefix_changed" not in s.parts


def test_removed_elsewhere_counts_as_evicted() -> None:
    s = events(50, 0, [NEVER] * 3, {"b": [GONE] * 3})
    assert s.parts == {"evicted": 48, "partial_block": 2}


def test_a_block_removed_while_the_request_waited_is_evicted() -> None:
    queued = BlockAt(True, False, 11.0)  # held at t = 10, removed at 11, first byte at 12
    s = events(50, 16, [HELD, queued, HELD])
    assert s.parts == {"hit": 16, "evicted": 32, "partial_block": 2}
    assert s.index_predicted == 48  # the index had them when the request was sent


def test_blocks_lost_to_a_cache_clear_are_evicted_and_counted_as_cleared() -> None:
    flushed = BlockAt(False, False, 5.0, True)  # removed by AllBlocksCleared at 5
    s = events(100, 16, [HELD, flushed, flushed, GONE, NEVER, NEVER])
    assert s.parts == {"hit": 16, "evicted": 48, "cold": 32, "partial_block": 4}
    assert s.cleared == 32  # the two flushed blocks; the third was an eviction
    # flushed on another replica too; and while the request waited for the engine
    s = events(50, 0, [NEVER] * 3, {"b": [flushed] * 3})
    assert s.parts == {"evicted": 48, "partial_block": 2} and s.cleared == 48
    s = events(50, 16, [HELD, BlockAt(True, False, 11.0, True), HELD])
    assert s.parts["evicted"] == 32 and s.cleared == 32
    # nothing cleared: no sub-count
    assert events(50, 0, [GONE] * 3).cleared == 0


def test_the_engine_missing_what_the_index_held_is_unknown() -> None:
    s = events(50, 16, [HELD, HELD, HELD])
    assert s.parts == {"hit": 16, "unknown": 32, "partial_block": 2}


def test_no_events_for_that_time() -> None:
    s = events(50, 16, None)
    assert s.parts == {"hit": 16, "unknown": 32, "partial_block": 2}
    assert s.index_predicted is None


def test_without_the_engines_figure_the_index_predicts_the_hit() -> None:
    assert events(50, None, [HELD, HELD, NEVER]).parts == {
        "hit": 32,
        "cold": 16,
        "partial_block": 2,
    }


def test_host_tier_blocks() -> None:
    host = BlockAt(False, True, 3.0)
    s = events(80, 32, [HELD, host, host, host, NEVER])
    assert s.host_hit == 16 and s.host_missed == 32
    assert s.parts["unknown"] == 32  # the engine did not load what its host tier held


def test_model_split() -> None:
    s = split_model(
        prompt_tokens=200,
        block_size=B,
        cached=32,
        here=64,
        best=96,
        best_replica="b",
        previous_tokens=160,
        changed_at=128,
        eviction_evidence=True,
    )
    assert s.parts == {
        "hit": 32,
        "evicted": 32,
        "elsewhere": 32,
        "prefix_changed": 32,  # from the change to the end of the previous prompt
        "cold": 64,  # 96 to the change at 128 (never computed), and the new tail past 160
        "partial_block": 8,
    }
    assert s.elsewhere_replica == "b"
    # without evidence of evictions, the model's shortfall is no eviction: unknown
    s = split_model(
        prompt_tokens=200,
        block_size=B,
        cached=32,
        here=64,
        best=96,
        best_replica="b",
        previous_tokens=160,
        changed_at=128,
    )
    assert s.parts["unknown"] == 32 and "evicted" not in s.parts
    s = split_model(
        prompt_tokens=200,
        block_size=B,
        cached=32,
        here=None,
        best=None,
        best_replica=None,
        previous_tokens=None,
        changed_at=None,
    )
    assert s.parts == {"hit": 32, "unknown": 160, "partial_block": 8}


blocks = st.lists(
    st.builds(BlockAt, st.booleans(), st.booleans(), st.none() | st.floats(0, 20), st.booleans()),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(
    L=st.integers(0, 700),
    cached=st.none() | st.integers(0, 800),
    mine=st.none() | blocks,
    others=st.dictionaries(st.sampled_from("xyz"), blocks, max_size=3),
    previous=st.none() | st.integers(0, 700),
    changed=st.booleans(),
)
def test_events_parts_sum_to_the_prompt(L, cached, mine, others, previous, changed) -> None:
    s = events(L, cached, mine, others, previous, changed)
    assert sum(s.parts.values()) == L
    assert all(v > 0 for v in s.parts.values()) and set(s.parts) <= set(CAUSES)
    assert 0 <= s.cleared <= s.parts.get("evicted", 0)  # a sub-count of evicted


@settings(max_examples=300, deadline=None)
@given(
    L=st.integers(0, 700),
    cached=st.none() | st.integers(-5, 800),
    here=st.none() | st.integers(0, 800),
    best=st.none() | st.integers(0, 800),
    previous=st.none() | st.integers(0, 700),
    changed_at=st.none() | st.integers(0, 800),
)
def test_model_parts_sum_to_the_prompt(L, cached, here, best, previous, changed_at) -> None:
    s = split_model(
        prompt_tokens=L,
        block_size=B,
        cached=cached,
        here=here,
        best=best,
        best_replica="r",
        previous_tokens=previous,
        changed_at=changed_at,
    )
    assert sum(s.parts.values()) == L
    assert all(v > 0 for v in s.parts.values()) and set(s.parts) <= set(CAUSES)


_SHARED = [BlockAt(True, False, None), BlockAt(False, False, None), BlockAt(False, True, None),
           BlockAt(False, False, 5.0), BlockAt(True, False, 15.0),
           BlockAt(False, False, 5.0, True)]  # fmt: skip


@given(
    mine=st.lists(st.sampled_from(range(len(_SHARED))), max_size=40),
    other=st.lists(st.sampled_from(range(len(_SHARED))), max_size=40),
    prompt=st.integers(1, 700),
    cached=st.one_of(st.none(), st.integers(0, 700)),
    previous=st.one_of(st.none(), st.integers(0, 700)),
    changed=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_runs_of_shared_states_split_as_block_by_block(
    mine, other, prompt, cached, previous, changed
) -> None:
    """States the index shares between blocks are split a run at a time: the same
    split as with a distinct object per block."""

    def split(copy: bool) -> tuple:
        def states(xs):
            return [BlockAt(*_SHARED[x]) if copy else _SHARED[x] for x in xs]

        out = split_events(
            prompt_tokens=prompt, block_size=16, cached=cached, mine=states(mine),
            others={"b": states(other)}, t=10.0, t_end=20.0, previous_tokens=previous,
            changed=changed,
        )  # fmt: skip
        return out.parts, out.elsewhere_replica, out.host_hit, out.host_missed, out.cleared

    assert split(False) == split(True)
