"""The ledger worker's own parts: a turn's tokens hash only their new tail, the queue is
bounded, the cache model names blocks without hashing each one, and goes on from the
session's previous turn with the ledgers computed afresh."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixgate.cache import PrefixCache
from prefixgate.config import parse_config
from prefixgate.events import content_keys
from prefixgate.ledger.cachemodel import BlockMemo, ReplicaModels, model_blocks, name_blocks
from prefixgate.ledger.worker import LedgerWorker, _first_changed
from prefixgate.record import Record
from prefixgate.record.record import Segment
from prefixgate.record.segments import first_changed
from prefixgate.sequences import common_prefix


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


# -- a session's ledgers, gone on from its previous turn, against each computed afresh --------


class _AfreshCache(PrefixCache):
    """The cache model's request as ``begin_blocks`` then ``end`` (the pool walked)."""

    def process_blocks(self, block_hashes, num_tokens):
        lease = self.begin_blocks(block_hashes, num_tokens)
        self.end(lease)
        return lease.result


class _Afresh(ReplicaModels):
    """Every prompt named from nothing (no memo, no previous turn), stored the long way."""

    def _names(self, segments, session):
        return name_blocks(segments, self.block_size)

    def _cache(self, replica: str) -> PrefixCache:
        c = self._caches.get(replica)
        if c is None:
            c = self._caches[replica] = _AfreshCache(self.block_size, self.capacity_tokens)
        return c


_step = st.tuples(
    st.sampled_from(["grow", "grow", "grow", "edit", "compact", "copy", "again"]),
    st.sampled_from(["s1", "s2"]),  # two sessions, interleaved
    st.sampled_from(["r1", "r1", "r2"]),  # on one replica mostly
    st.integers(0, 10_000),  # where an edit lands, and what it writes
    st.integers(0, 700),  # a new segment's tokens
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_step, min_size=1, max_size=30), st.sampled_from([1 << 20, 256 * 24]))
def test_a_sessions_ledgers_are_those_computed_afresh(steps, capacity) -> None:
    """Each turn's ledger from a worker that goes on from the session's previous turn (its
    names, the pool's kept blocks) equals the one from a worker that computes every turn
    from nothing: growing turns, an edited history, a compaction, equal segments that are
    not the same objects, two sessions and two replicas, a pool that evicts."""
    fast = worker(model_capacity_tokens=capacity)
    slow = worker(model_capacity_tokens=capacity)
    slow._models["c"] = _Afresh(capacity_tokens=capacity)
    prompts: dict[str, list[Segment]] = {}
    for n, (op, session, replica, at, tokens) in enumerate(steps):
        p = prompts.get(session) or [seg("tools", 300, "tools"), seg("tool-x", 99, "tool")]
        fresh = seg(f"m{n}", tokens)
        if op == "grow":
            p = [*p, fresh]
        elif op == "edit" and len(p) > 2:
            i = 2 + at % (len(p) - 2)
            p = [*p[:i], seg(f"e{n}", tokens), *p[i + 1 :]]
        elif op == "compact":
            p = [*p[:2], seg(f"summary{n}", tokens), fresh]
        elif op == "copy":  # equal segments, other objects
            p = [Segment(s.kind, s.name, s.hash, s.chars, s.tokens) for s in p]
        before, prompts[session] = prompts.get(session), p
        if before is not None:  # the change found past the equal start: as found afresh
            assert _first_changed(before, p) == first_changed(before, p)
        rec = Record(
            request_id=str(n),
            received_at=float(n),
            session_id=session,
            channel="c",
            replica=replica,
            prompt_tokens=2 * sum(s.tokens for s in p if s.kind != "tool") + at % 3,
            cached_tokens=at % 500 if at % 4 else None,
            segments_out=p,
        )
        got = [asyncio.run(w.compute(rec, None)) for w in (fast, slow)]
        assert got[0] == got[1]
    for name, cache in fast._models["c"]._caches.items():
        afresh = slow._models["c"]._caches[name].pool
        assert cache.pool.free_order() == afresh.free_order()
        assert cache.pool.copies() == afresh.copies()


def test_the_names_kept_for_sessions_are_bounded() -> None:
    """The block names kept per session (to go on from) stay within ``named_limit``, the
    least recent session's dropped first; a prompt bigger than the bound is not kept."""
    m = ReplicaModels(256, named_limit=40)
    for i in range(30):
        m.see("r1", [seg("tools", 300, "tools"), seg(f"m{i}", 2000)], 5000, session=i)
        assert m._named_count == sum(len(n.names) + len(n.counts) for n in m._named.values())
        assert m._named_count <= 40
    assert list(m._named) == [27, 28, 29]  # 12 each: 9 names and 3 marks
    m.see("r1", [seg("tools", 300, "tools"), seg("huge", 20_000)], 5000, session="big")
    assert "big" not in m._named and m._named_count <= 40


@given(st.lists(st.integers(0, 3), max_size=40), st.lists(st.integers(0, 3), max_size=40))
def test_common_prefix_is_the_leading_run_of_equal_items(a, b) -> None:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_prefix(a, b) == n


class _CountingStore:
    """A store that keeps what each ``write_ledgers`` call was given."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def migrate(self) -> int:
        return 0

    def write_ledgers(self, ledgers) -> None:
        self.calls.append([x.request_id for x in ledgers])

    def close(self) -> None:
        pass


def test_ledgers_finished_within_the_interval_share_one_write() -> None:
    """Turns that come one at a time, each computed before the next is fed, wait for the
    interval (or a full batch) and are written together, in order."""
    store = _CountingStore()
    w = worker(store=lambda: store, flush_interval=3600.0, batch_size=4)  # type: ignore[arg-type, return-value]

    def rec(i: int) -> Record:
        return Record(
            request_id=f"r{i}",
            received_at=1.0 + i,
            session_id="s",
            channel="c",
            replica="http://x/v1",
            prompt_tokens=100 + i,
            segments_out=[seg("m", 25 + i)],
        )

    async def run() -> None:
        await w.start()
        for i in range(6):
            w.feed(rec(i), None)
            while w.computed <= i:
                await asyncio.sleep(0.001)
        for _ in range(10):  # the loop turns: nothing more is written before the interval
            await asyncio.sleep(0.001)
        assert store.calls == [["r0", "r1", "r2", "r3"]]  # a full batch goes at once
        await w.drain()
        assert store.calls == [["r0", "r1", "r2", "r3"], ["r4", "r5"]]
        await w.aclose()

    asyncio.run(run())
    assert w.written == 6
