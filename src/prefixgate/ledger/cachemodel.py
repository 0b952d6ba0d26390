"""The cache model's view of a channel's replicas, fed the recorded prompts: what the
ledger says without engine events, and the model's prediction beside the index's.

A request's upstream prompt is its captured segments (``segments_out``), each as long as
its estimated tokens: the doctor's replay (:mod:`prefixgate.doctor.predict`), online. Its
blocks of ``MODEL_BLOCK`` estimated tokens are named without hashing each one: a block is
the prefix up to its end, so it is named by the chained key of the segment it ends in
(one hash per segment, chained like vLLM's blocks: equal prefixes, equal keys) and its
offset in that segment. Each replica has a :class:`~prefixgate.cache.PrefixCache` of
``capacity_tokens`` (LRU beyond): what that replica computed recently. For a request
the model gives

- ``here``: what the serving replica would hit had it kept everything it computed
  (the engine's ``cached_tokens`` below that is read as evicted);
- ``best``: the most another replica would hit (a routing loss beyond ``here``);

in estimated tokens scaled to the request's real ``prompt_tokens`` (coarse: a block is
about ``MODEL_BLOCK`` tokens, and the estimates are about 4 characters a token). Then the
prompt is stored on the serving replica's model, as the engine does. A 48k-token prompt
costs about 0.2 ms (one hash per segment, a few hundred blocks), not one hash per block.
A session's next turn costs what its new tail costs: its names go on from those of the
session's last prompt after the segments equal to it (:func:`name_blocks`), and the
replica's pool keeps the blocks of the prompts it stored last where they stand
(:meth:`~prefixgate.cache.pool.BlockPool.process`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from hashlib import blake2b

from prefixgate.cache import PrefixCache
from prefixgate.record.record import Segment
from prefixgate.sequences import common_prefix

__all__ = ["BlockMemo", "ModelView", "Named", "ReplicaModels", "model_blocks", "name_blocks"]

CAPACITY_TOKENS = 1_000_000  # per replica: the recent past the model remembers
MODEL_BLOCK = 256  # estimated tokens per block of the model


@dataclass(frozen=True, slots=True)
class ModelView:
    here: int  # tokens the serving replica's model would hit (never evicting)
    best: int  # the most another replica's model would hit
    best_replica: str | None
    scale: float  # real tokens per estimated token


def model_blocks(
    segments: Sequence[Segment], block: int = MODEL_BLOCK, memo: BlockMemo | None = None
) -> tuple[list, int]:
    """The names of the prompt's full blocks and its length, in estimated tokens
    (``tool`` segments are parts of ``tools``). ``memo``: what segments named before (an
    agent re-sends its conversation: a segment after the same chained key, with the same
    hash, at the same offset in a block, names the same blocks), looked up, not hashed."""
    named = name_blocks(list(segments), block, memo)
    return named.names, named.tokens


@dataclass(slots=True)
class Named:
    """A prompt's block names (:func:`name_blocks`), and where the walk stood before each
    of its segments, to go on from for a prompt that starts with the same segments."""

    segments: list[Segment]
    names: list
    tokens: int
    # before segment i (and after the last, at len(segments)): names so far, chained key,
    # estimated tokens so far
    counts: list[int]
    keys: list[bytes]
    starts: list[int]


def name_blocks(
    segments: list[Segment],
    block: int = MODEL_BLOCK,
    memo: BlockMemo | None = None,
    before: Named | None = None,
    own: bool = False,
) -> Named:
    """:func:`model_blocks`, with where the walk stood at each segment. ``before``: a
    prompt named earlier (a session's previous request): the walk goes on from the first
    segment that differs from its own (compared whole, in C), so a turn names its new
    tail only. ``own``: ``before`` is the caller's to give up (a session's previous
    prompt, replaced by this one): its lists are cut back and extended in place, where a
    copy would write to every name of the conversation."""
    names: list[Hashable] = []
    key = b""
    start = 0  # estimated tokens before the current segment
    counts: list[int] = []
    keys: list[bytes] = []
    starts: list[int] = []
    j = 0
    if before is not None:
        j = common_prefix(segments, before.segments)
        if j and own:  # cut back and extended in place: nothing copied
            names, counts, keys, starts = before.names, before.counts, before.keys, before.starts
            key, start = keys[j], starts[j]
            del names[counts[j] :]
            del counts[j:], keys[j:], starts[j:]
        elif j:
            names = before.names[: before.counts[j]]
            key, start = before.keys[j], before.starts[j]
            counts, keys, starts = before.counts[:j], before.keys[:j], before.starts[:j]
    for s in segments[j:]:
        counts.append(len(names))
        keys.append(key)
        starts.append(start)
        tokens = s.tokens
        if s.kind == "tool" or tokens <= 0:
            continue
        if memo is not None:
            mkey = (key, s.hash, start % block, tokens)
            got = memo.get(mkey)
        else:
            got = None
        if got is None:
            key = blake2b(key + s.hash.encode(), digest_size=16).digest()
            end = start + tokens
            first = -(-(start + 1) // block) * block  # the first block end inside it
            mine = tuple([(key, at - start) for at in range(first, end + 1, block)])
            if memo is not None:
                memo.put(mkey, (key, mine))
        else:
            key, mine = got
        names.extend(mine)
        start += tokens
    counts.append(len(names))
    keys.append(key)
    starts.append(start)
    return Named(segments, names, start, counts, keys, starts)


class BlockMemo:
    """A segment's chained key and the block names it holds, by its predecessor's key,
    its hash, where it starts in a block and its length; up to ``limit`` names kept
    (then forgotten all at once: the next turn names them again)."""

    def __init__(self, limit: int = 1 << 16) -> None:
        self._d: dict[tuple, tuple[bytes, tuple]] = {}
        self._names = 0
        self.limit = limit

    def get(self, key: tuple) -> tuple[bytes, tuple] | None:
        return self._d.get(key)

    def put(self, key: tuple, value: tuple[bytes, tuple]) -> None:
        self._names += 1 + len(value[1])
        if self._names > self.limit:
            self._d.clear()
            self._names = 1 + len(value[1])
        self._d[key] = value


def _size(named: Named) -> int:
    """What a kept :class:`Named` counts against ``named_limit``: its names and segments."""
    return len(named.names) + len(named.counts)


class ReplicaModels:
    """One cache model per replica of one channel. The block names of each session's
    last prompt are kept (up to ``named_limit`` names in all, the least recent session's
    dropped first; a segment counts as one), so that its next prompt names its new tail
    only."""

    def __init__(
        self,
        block_size: int = MODEL_BLOCK,
        capacity_tokens: int = CAPACITY_TOKENS,
        named_limit: int = 1 << 16,
    ) -> None:
        self.block_size = block_size
        self.capacity_tokens = capacity_tokens
        self._caches: dict[str, PrefixCache] = {}
        self._memo = BlockMemo()
        self._named: OrderedDict[Hashable, Named] = OrderedDict()
        self._named_count = 0  # names held by _named
        self.named_limit = named_limit

    def _cache(self, replica: str) -> PrefixCache:
        c = self._caches.get(replica)
        if c is None:
            c = self._caches[replica] = PrefixCache(self.block_size, self.capacity_tokens)
        return c

    def _names(self, segments: Sequence[Segment], session: Hashable | None) -> Named:
        segments = segments if isinstance(segments, list) else list(segments)
        if session is None:
            return name_blocks(segments, self.block_size, self._memo)
        before = self._named.pop(session, None)
        if before is not None:
            self._named_count -= _size(before)
        named = name_blocks(segments, self.block_size, self._memo, before, own=True)
        if _size(named) <= self.named_limit:
            self._named[session] = named
            self._named_count += _size(named)
            while self._named_count > self.named_limit:
                self._named_count -= _size(self._named.popitem(last=False)[1])
        return named

    def see(
        self,
        replica: str,
        segments: Sequence[Segment],
        prompt_tokens: int,
        session: Hashable | None = None,
    ) -> ModelView:
        """The model's view of a request to ``replica``, then its prompt stored there.
        ``session``: the request's session, whose last prompt's names are gone on from."""
        named = self._names(segments, session)
        names, n = named.names, named.tokens
        if n == 0:
            return ModelView(0, 0, None, 1.0)
        scale = prompt_tokens / n if prompt_tokens else 1.0
        mine = self._cache(replica)
        best, best_replica = 0, None
        for name, cache in self._caches.items():
            if name != replica:
                got = cache.peek_blocks(names, n)
                if got > best:
                    best, best_replica = got, name
        here = mine.process_blocks(names, n).cached_tokens
        return ModelView(round(here * scale), round(best * scale), best_replica, scale)
