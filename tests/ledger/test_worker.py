"""The ledger worker's own parts: a turn's tokens hash only their new tail, the queue is
bounded, the cache model names blocks without hashing each one."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.config import parse_config
from prefixgate.events import content_keys
from prefixgate.ledger.cachemodel import BlockMemo, ReplicaModels, model_blocks
from prefixgate.ledger.worker import LedgerWorker
from prefixgate.record import Record
from prefixgate.record.record import Segment


def worker(**kw) -> LedgerWorker:
    config = parse_config({"channels": [{"name": "c", "base_url": "http://x/v1"}], "store": None})
    return LedgerWorker(config, **kw)


def test_a_sessions_turn_reuses_the_keys_it_shares() -> None:
    w = worker()
    rec = Record(request_id="a", received_at=1.0, session_id="s", channel="c")

    async def run() -> None:
        ids = list(range(20_000))
        assert await w._session_keys(rec, ids, 16) == content_keys(ids, 16)
        edited = ids[:10_005] + [7] * 5000  # the same first 625 blocks, then another text
        assert await w._session_keys(rec, edited, 16) == content_keys(edited, 16)
        assert await w._session_keys(rec, edited[:33], 16) == content_keys(edited[:33], 16)

    asyncio.run(run())


def test_the_queue_is_bounded() -> None:
    w = worker(queue_max=3)

    async def run() -> None:
        for i in range(5):
            w.feed(Record(request_id=str(i), received_at=1.0, channel="c", prompt_tokens=10), {})
        w.feed(Record(request_id="x", received_at=1.0, channel="c"), {})  # no usage: skipped

    asyncio.run(run())
    assert len(w._queue) == 3 and w.dropped == 2


def seg(name: str, tokens: int, kind: str = "message") -> Segment:
    return Segment(kind, name, name.ljust(32, "0"), tokens * 4, tokens)


def test_the_models_blocks_are_named_by_their_prefix() -> None:
    a = [seg("tools", 300, "tools"), seg("tool-x", 99, "tool"), seg("m1", 250), seg("m2", 100)]
    names, n = model_blocks(a, 256)
    assert n == 650 and len(names) == 2  # block ends at 256 and 512; 650 is partial
    b = [*a[:3], seg("other", 100)]
    assert model_blocks(b, 256)[0] == names  # same first 550 tokens: same names
    c = [seg("tools", 300, "tools"), seg("m1-edited", 250), seg("m2", 100)]
    assert model_blocks(c, 256)[0][0] == names[0] and model_blocks(c, 256)[0][1] != names[1]
    m = ReplicaModels(256)
    first = m.see("r1", a, 1300)  # real tokens: twice the estimate
    assert (first.here, first.best, first.scale) == (0, 0, 2.0)
    again = m.see("r1", b, 1300)
    assert again.here == 1024  # 512 estimated tokens, scaled
    elsewhere = m.see("r2", b, 1300)
    assert (elsewhere.here, elsewhere.best, elsewhere.best_replica) == (0, 1024, "r1")


_segment = st.builds(
    lambda name, tokens, kind: seg(name, tokens, kind),
    st.sampled_from(["a", "b", "c", "d", "e"]),
    st.integers(0, 700),
    st.sampled_from(["message", "message", "tool", "tools", "system"]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(_segment, max_size=12), min_size=1, max_size=6), st.integers(1, 40))
def test_blocks_named_through_the_memo_are_the_blocks_named_afresh(prompts, limit) -> None:
    # a session's turns: each prompt its predecessor's with segments edited or added
    memo, turns = BlockMemo(limit), []
    for p in prompts:
        turns.append([*(turns[-1][: len(p) // 2] if turns else []), *p])
    biggest = max([limit] + [2 + s.tokens // 256 for t in turns for s in t])  # one entry
    for segments in turns + turns[::-1]:
        assert model_blocks(segments, 256, memo) == model_blocks(segments, 256)
        assert memo._names <= biggest


def test_the_keys_routing_computed_are_not_computed_again() -> None:
    """``routing: precise`` computed the request's engine keys at the ledger's block size:
    the ledger takes them (and still counts a length that differs from the engine's)."""
    from prefixgate.routing.prefix import PromptBlocks

    w = worker()
    ch = w.channels["c"]
    rec = Record(request_id="a", received_at=1.0, channel="c", prompt_tokens=40)
    keys = content_keys(list(range(40)), 16)

    async def run() -> None:
        known = PromptBlocks(tuple(keys), 16, 40)
        assert await w._keys(ch, rec, None, 16, known) == keys and w.token_mismatches == 0
        assert await w._keys(ch, rec, None, 16, PromptBlocks(tuple(keys), 16, 41)) == keys
        assert w.token_mismatches == 1
        # the estimate's blocks, or another block size: not the engine's keys
        assert await w._keys(ch, rec, None, 16, PromptBlocks(tuple(keys), 16)) is None
        assert await w._keys(ch, rec, None, 32, known) is None

    asyncio.run(run())


def test_the_gateway_without_a_ledger_takes_what_the_worker_takes() -> None:
    """``store.ledger: false`` puts a stand-in where the worker goes: the request path
    calls both alike."""
    import inspect

    from prefixgate.gateway import NullLedger

    assert list(inspect.signature(NullLedger.feed).parameters) == list(
        inspect.signature(LedgerWorker.feed).parameters
    )
    NullLedger().feed(Record(request_id="a", received_at=1.0), {}, None)
