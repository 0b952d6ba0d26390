"""KV cache groups: what each group needs for a hit, and the veto / promote lookups."""

from __future__ import annotations

import pytest

from prefixgate.cache.groups import (
    ExternalHit,
    KVGroup,
    agreed_hit,
    external_hit,
    format_groups,
    group_hit,
    parse_groups,
    tail_chunks,
)

FULL = KVGroup("full")
WIN8 = KVGroup("window", window_tokens=8)  # block size 4: ceil(7 / 4) = 2 blocks
DRAFT = KVGroup("draft", volatile_blocks=1)


def test_parse_and_format_groups():
    groups = parse_groups("full, window:4096, draft:1")
    assert groups == (FULL, KVGroup("window", window_tokens=4096), DRAFT)
    assert format_groups(groups) == "full,window:4096,draft:1"
    assert parse_groups("full,window:4k,mtp") == (FULL, KVGroup("window", 4096), DRAFT)
    for bad in ("", "window", "full:3", "nope", "draft:x"):
        with pytest.raises(ValueError):
            parse_groups(bad)


def test_window_needs_only_the_last_blocks():
    assert WIN8.window_blocks(4) == 2
    assert KVGroup("window", window_tokens=4096).window_blocks(64) == 64
    present = [False, False, True, True]
    assert group_hit(FULL, present, 4, end=4) == 0
    assert group_hit(WIN8, present, 4, end=4) == 4


def test_a_block_missing_outside_the_window_still_hits():
    # block 0 changed (or was evicted): full attention misses, the window group does not
    present = [False, True, True, True, True]
    assert group_hit(FULL, present, 4, end=5) == 0
    assert group_hit(WIN8, present, 4, end=5) == 5
    # a hole inside the window moves the window group's hit back to the last full window
    present = [True, True, True, False, True]
    assert group_hit(WIN8, present, 4, end=5) == 3
    assert group_hit(WIN8, [True, False], 4, end=2) == 1  # reaches back to the start


def test_agreed_hit_is_the_and_of_groups():
    full_p = [True, True, True, False]
    win_p = [True, True, False, True]
    assert agreed_hit([FULL], [full_p], 4, 4) == 3
    # window needs blocks 1 and 2 before end 3: block 2 is missing, so back to end 2
    assert agreed_hit([FULL, WIN8], [full_p, win_p], 4, 4) == 2
    assert agreed_hit([FULL, WIN8], [full_p, [False] * 4], 4, 4) == 0


def test_tail_chunks():
    assert tail_chunks([True, True, False, True], 4, 0) == 1
    assert tail_chunks([True, True, False, True], 3, 0) == 0
    assert tail_chunks([True, True, True], 3, 1) == 2


def test_veto_vs_promote_on_the_volatile_tail():
    groups = [FULL, WIN8, DRAFT]
    base = [True, True, True, True]  # blocks 1..3 in host memory (block 0 on the GPU)
    draft = [True, True, True, False]  # the draft group's trailing block was never stored
    present = [base, base, draft]
    assert external_hit(groups, present, 4, end=4, start=1, policy="veto") == ExternalHit(0)
    # promote: load blocks 1..3 (12 tokens), recompute a window's worth (8 tokens)
    assert external_hit(groups, present, 4, end=4, start=1, policy="promote") == ExternalHit(3, 8)
    # every group holds a chunk at the anchor: no veto, the agreed hit is served
    draft_ok = [True, True, True, True]
    ok = [base, base, draft_ok]
    assert external_hit(groups, ok, 4, end=4, start=1, policy="veto") == ExternalHit(3)
    assert external_hit(groups, ok, 4, end=4, start=1, policy="promote") == ExternalHit(3)
    with pytest.raises(ValueError):
        external_hit(groups, ok, 4, end=4, start=1, policy="other")  # type: ignore[arg-type]


def test_promote_recompute_is_capped_by_what_was_loaded():
    groups = [FULL, KVGroup("window", window_tokens=64)]
    hit = external_hit(groups, [[True, True], [True, False]], 4, end=2, start=1, policy="promote")
    assert hit == ExternalHit(1, 4)
