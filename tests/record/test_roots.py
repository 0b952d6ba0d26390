"""A session's records stored as a difference to its root record (record/roots.py), and
read back whole (store/lists.py's ``joined``): the decisions, and the round trip over
generated sessions."""

from __future__ import annotations

import random

from prefixgate.record.record import Record, Segment, SegmentsRoot
from prefixgate.record.roots import SegmentRoots
from prefixgate.store.lists import joined


def seg(i: int, kind: str = "message") -> Segment:
    return Segment(kind, f"messages[{i}]", f"{i:032x}", 40 + i, 10)


def rec(n: int, segments_in, segments_out=..., *, session: str | None = "s") -> Record:
    out = segments_in if segments_out is ... else segments_out
    return Record(
        request_id=f"r{n}",
        received_at=float(n),
        session_id=session,
        segments_in=segments_in,
        segments_out=out,
    )


def back(stored: Record, roots: dict[str, Record]) -> tuple[list | None, list | None]:
    """The whole lists of a record as stored, from its root as stored."""
    r = stored.segments_root
    if r is None:
        return stored.segments_in, stored.segments_out
    root = roots[r.request_id]
    base = (root.segments_in, root.segments_out)
    return joined(base, (stored.segments_in, stored.segments_out), r.keep_in, r.keep_out)


def test_a_growing_session_is_stored_as_tails_after_its_root() -> None:
    roots = SegmentRoots()
    prompt = [seg(i) for i in range(40)]
    first = roots.stored(rec(0, prompt))
    assert first.segments_root is None  # the session's first record: whole, its root
    grown = [*prompt, seg(40), seg(41)]
    second = roots.stored(rec(1, grown))
    assert second.segments_root == SegmentsRoot("r0", 40, -1)  # out is in: one list
    assert second.segments_in == [seg(40), seg(41)]
    assert second.segments_out is None
    # the record handed in keeps its whole lists: the gateway's other readers see them
    original = rec(2, [*grown, seg(42)])
    third = roots.stored(original)
    assert original.segments_in is not None and len(original.segments_in) == 43
    assert original.segments_root is None
    assert third.segments_root == SegmentsRoot("r0", 40, -1)
    assert back(third, {"r0": first}) == (original.segments_in, original.segments_in)


def test_a_different_upstream_list_keeps_its_own_prefix() -> None:
    roots = SegmentRoots()
    sys_ = Segment("system", "system[0]", "f" * 32, 100, 25)
    prompt = [seg(i) for i in range(30)]
    root = roots.stored(rec(0, [*prompt, sys_], [sys_, *prompt]))  # the engine hoists
    cur_in, cur_out = [*prompt, sys_, seg(30)], [sys_, *prompt, seg(30)]
    stored = roots.stored(rec(1, cur_in, cur_out))
    assert stored.segments_root == SegmentsRoot("r0", 31, 31)
    assert stored.segments_in == [seg(30)] and stored.segments_out == [seg(30)]
    assert back(stored, {"r0": root}) == (cur_in, cur_out)


def test_a_new_root_when_nothing_is_shared_or_the_tails_grow_past_a_quarter() -> None:
    roots = SegmentRoots()
    prompt = [seg(i) for i in range(8)]
    assert roots.stored(rec(0, prompt)).segments_root is None
    assert roots.stored(rec(1, [*prompt, seg(8)])).segments_root is not None  # 1 of 9
    three = [*prompt, seg(8), seg(9), seg(10)]
    became = roots.stored(rec(2, three))  # 3 of 11 > a quarter: a root again
    assert became.segments_root is None
    assert roots.stored(rec(3, [*three, seg(11)])).segments_root == SegmentsRoot("r2", 11, -1)
    compacted = [seg(100), seg(101)]
    assert roots.stored(rec(4, compacted)).segments_root is None  # shares nothing
    assert roots.stored(rec(5, [*compacted, seg(104)])).segments_root is None  # 1 of 3 > 1/4
    assert roots.stored(rec(6, [*compacted, seg(104)])).segments_root == SegmentsRoot("r5", 3, -1)


def test_records_without_a_session_or_an_upstream_list_are_stored_whole() -> None:
    roots = SegmentRoots()
    prompt = [seg(i) for i in range(10)]
    assert roots.stored(rec(0, prompt, session=None)).segments_root is None
    assert roots.stored(rec(1, prompt, session=None)).segments_root is None
    assert len(roots) == 0
    roots.stored(rec(2, prompt))
    failed = rec(3, [*prompt, seg(10)], None)  # refused before anything went upstream
    assert roots.stored(failed) is failed
    assert roots.stored(rec(4, [*prompt, seg(10)])).segments_root == SegmentsRoot("r2", 10, -1)


def test_a_root_not_stored_is_forgotten_and_the_bound_holds() -> None:
    roots = SegmentRoots(max_sessions=2)
    prompt = [seg(i) for i in range(10)]
    root = roots.stored(rec(0, prompt))
    roots.forget(root)  # the journal refused it
    assert roots.stored(rec(1, [*prompt, seg(10)])).segments_root is None  # a root again
    delta = roots.stored(rec(2, [*prompt, seg(10)]))
    roots.forget(delta)  # a record built on the root: the root stays
    assert roots.stored(rec(3, [*prompt, seg(10)])).segments_root == SegmentsRoot("r1", 11, -1)
    for n, sid in enumerate(("a", "b"), start=10):
        roots.stored(rec(n, prompt, session=sid))
    assert len(roots) == 2  # "s" was the least recently used: out
    assert roots.stored(rec(20, [*prompt, seg(10)])).segments_root is None


def test_generated_sessions_read_back_whole() -> None:
    rng = random.Random(35)
    for trial in range(200):
        roots = SegmentRoots()
        stored_roots: dict[str, Record] = {}
        prompt: list[Segment] = [seg(i) for i in range(rng.randint(1, 12))]
        fresh = 1000
        for n in range(40):
            action = rng.random()
            if action < 0.6:
                prompt = prompt + [seg(fresh + k) for k in range(rng.randint(1, 3))]
            elif action < 0.75 and len(prompt) > 2:  # an edit inside the prompt
                at = rng.randrange(len(prompt))
                prompt = prompt[:at] + [seg(fresh)] + prompt[at + 1 :]
            elif action < 0.8:  # a compaction
                prompt = [seg(fresh + k) for k in range(rng.randint(1, 4))]
            fresh += 10
            if rng.random() < 0.5:
                out = prompt
            else:  # the engine's order: the last message first
                out = [prompt[-1], *prompt[:-1]]
            original = rec(trial * 100 + n, list(prompt), list(out))
            stored = roots.stored(original)
            if stored.segments_root is None:
                stored_roots[stored.request_id] = stored
            assert back(stored, stored_roots) == (original.segments_in, original.segments_out)


def test_the_roots_are_bounded_by_the_segments_they_hold() -> None:
    roots = SegmentRoots(max_segments=100)
    prompts = {sid: [seg(i + 1000 * k) for i in range(30)] for k, sid in enumerate("abcd")}
    for n, (sid, prompt) in enumerate(prompts.items()):
        roots.stored(rec(n, prompt, session=sid))
    assert len(roots) == 3 and roots.segments == 90  # "a" out: 120 past the bound
    grown = [*prompts["a"], seg(99_999)]
    assert roots.stored(rec(10, grown, session="a")).segments_root is None  # a root again
    assert roots.stored(rec(11, prompts["d"] + [seg(5)], session="d")).segments_root is not None
    hoisted = [prompts["c"][-1], *prompts["c"][:-1]]
    roots.stored(rec(12, [*prompts["c"], seg(7)], hoisted, session="c"))  # c: 31 + 30
    assert roots.segments <= 100 and roots.segments == sum(
        len(r.segments_in) + len(r.segments_out or ()) for r in roots._roots.values()
    )
