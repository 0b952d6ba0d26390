"""The split itself: a request's prompt tokens into causes, from what is known of it.

Pure functions, no I/O, no clock: :func:`split_events` takes the serving replica's blocks
as they were when the request was sent (:meth:`~prefixgate.events.ReplicaIndex.blocks_at`)
and the other replicas'; :func:`split_model` takes the cache model's figures. Both return
a :class:`Split` whose parts sum to ``prompt_tokens`` by construction: every token of
``[0, L)`` is given exactly one cause, range by range.

The rules (``B`` the block size, ``L`` the prompt tokens, ``cap = floor((L-1)/B) * B``):

- ``[0, hit)`` is ``hit``: the engine's ``cached_tokens`` (the index's or the model's
  prediction when the engine did not say);
- ``[max(hit, cap), L)`` is ``partial_block``;
- each block of ``[hit, cap)`` gets the cause of the first rule that holds for it:
  held by the serving replica at ``t`` but removed before the first byte: ``evicted``;
  held at ``t`` (the engine missed a block the index had): the cause of the block where
  the hit stopped, ``unknown`` if that one is such a block too; removed from the serving
  replica before ``t``: ``evicted``; held by another replica at ``t``: ``elsewhere``;
  removed from another replica before ``t``: ``evicted``; within the previous prompt of
  the session, which changed: ``prefix_changed``; else ``cold``.

An ``evicted`` block whose removal was the engine clearing its cache (``AllBlocksCleared``:
a flush, a reset, a restart; :attr:`BlockAt.cleared`) is also counted in ``cleared``, a
sub-count of ``evicted`` like ``host_hit`` of ``hit``: the sum rule is unchanged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prefixgate.cache.blocks import hit_tokens_cap
from prefixgate.events.history import BlockAt

__all__ = ["Split", "split_events", "split_model"]

_CLEARED = "cleared"  # internal: ``evicted`` by a cache clear (booked as both)


@dataclass
class Split:
    parts: dict[str, int] = field(default_factory=dict)
    index_predicted: int | None = None
    elsewhere_replica: str | None = None
    host_hit: int = 0
    host_missed: int = 0
    cleared: int = 0  # evicted tokens whose removal was a cache clear

    def add(self, cause: str, tokens: int) -> None:
        if tokens > 0:
            if cause == _CLEARED:
                self.cleared += tokens
                cause = "evicted"
            self.parts[cause] = self.parts.get(cause, 0) + tokens


def _bounds(prompt_tokens: int, block_size: int, hit: int) -> tuple[int, int]:
    """``hit`` clamped into the prompt, and where the hittable part ends."""
    hit = max(0, min(hit, prompt_tokens))
    return hit, max(hit_tokens_cap(prompt_tokens, block_size), hit)


def _leading(blocks: Sequence[BlockAt], limit: int) -> int:
    n = 0
    for b in blocks[:limit]:
        if not b.held:
            break
        n += 1
    return n


def split_events(
    *,
    prompt_tokens: int,
    block_size: int,
    cached: int | None,
    mine: Sequence[BlockAt] | None,
    others: Mapping[str, Sequence[BlockAt]],
    t: float,
    t_end: float,
    previous_tokens: int | None,
    changed: bool,
) -> Split:
    """The split from the index. ``mine`` is ``None`` when no events cover ``t`` on the
    serving replica (then what did not hit is ``unknown``); ``previous_tokens`` is the
    prompt length of the session's previous request on this channel, ``changed`` whether
    this prompt differs from it before its end."""
    L, B = prompt_tokens, block_size
    out = Split()
    limit = hit_tokens_cap(L, B) // B
    if mine is not None:
        out.index_predicted = _leading(mine, limit) * B
    hit, top = _bounds(L, B, cached if cached is not None else out.index_predicted or 0)
    out.add("hit", hit)
    out.add("partial_block", L - top)
    if mine is None:
        out.add("unknown", top - hit)
        return out
    out.host_hit = sum(B for b in mine[: hit // B] if b.host and not b.gpu)
    prev_blocks = (previous_tokens or 0) // B if changed else 0
    where: Counter[str] = Counter()
    broke: str | None = None
    i, end = hit // B, -(-top // B)
    while i < end:
        # a run of blocks whose states are the same objects (the index shares them)
        # gets one cause; the first block alone, as it decides ``broke``
        j = i + 1 if broke is None else _run_end(i, end, mine, others, prev_blocks)
        lo, hi = max(i * B, hit), min(j * B, top)
        cause, name = _cause(i, mine, others, t, t_end, prev_blocks, broke)
        if name is not None:
            where[name] += j - i
        if broke is None:
            broke = cause
        if i < len(mine) and mine[i].host and not mine[i].gpu:
            out.host_missed += hi - lo
        out.add(cause, hi - lo)
        i = j
    if where:
        out.elsewhere_replica = where.most_common(1)[0][0]
    return out


def _run_end(
    i: int,
    end: int,
    mine: Sequence[BlockAt],
    others: Mapping[str, Sequence[BlockAt]],
    prev_blocks: int,
) -> int:
    """The end of the run from block ``i`` on whose inputs to :func:`_cause` are the same:
    the same state objects here and on every other replica, on the same side of
    ``prev_blocks`` and of each list's end."""
    if i >= len(mine):
        return end  # all "unknown"
    limit = min(end, len(mine), prev_blocks if i < prev_blocks else end)
    first = mine[i]
    theirs = []
    for blocks in others.values():
        if i < len(blocks):
            limit = min(limit, len(blocks))
            theirs.append((blocks, blocks[i]))
    j = i + 1
    if not theirs:
        while j < limit and mine[j] is first:
            j += 1
        return j
    while j < limit and mine[j] is first:
        for blocks, o in theirs:
            if blocks[j] is not o:
                return j
        j += 1
    return j


def _cause(
    i: int,
    mine: Sequence[BlockAt],
    others: Mapping[str, Sequence[BlockAt]],
    t: float,
    t_end: float,
    prev_blocks: int,
    broke: str | None,
) -> tuple[str, str | None]:
    """Block ``i``'s cause, and for ``elsewhere`` the replica that holds it."""
    if i >= len(mine):  # the engine's prompt is longer than the tokens asked of the index
        return "unknown", None
    b = mine[i]
    if b.held:
        if b.removed_at is not None and t < b.removed_at <= t_end:
            return _gone(b), None  # removed while the request waited for the engine
        return broke or "unknown", None
    if b.removed_at is not None and b.removed_at <= t:
        return _gone(b), None
    gone_elsewhere: str | None = None
    for name, blocks in others.items():
        if i < len(blocks):
            o = blocks[i]
            if o.held:
                return "elsewhere", name
            if o.removed_at is not None and o.removed_at <= t:
                gone_elsewhere = gone_elsewhere or _gone(o)
    if gone_elsewhere:
        return gone_elsewhere, None
    return ("prefix_changed" if i < prev_blocks else "cold"), None


def _gone(b: BlockAt) -> str:
    """The cause of a block removed before it was asked for: by a clear or an eviction."""
    return _CLEARED if b.cleared else "evicted"


def split_model(
    *,
    prompt_tokens: int,
    block_size: int,
    cached: int | None,
    here: int | None,
    best: int | None,
    best_replica: str | None,
    previous_tokens: int | None,
    changed_at: int | None,
    eviction_evidence: bool = False,
) -> Split:
    """The split from the cache model: ``here`` the tokens the serving replica's model
    would hit had it never evicted, ``best`` the most another replica's model would hit
    (``None`` both without segments: what did not hit is then ``unknown``);
    ``changed_at`` the token offset where this prompt first differs from the session's
    previous one (``None``: it does not). What the model would hit beyond the engine's
    figure is ``evicted`` only with ``eviction_evidence`` (the engine's cache size or its
    counters show evictions); without, a shortfall alone proves nothing (the model's
    estimate, a template it does not know) and is ``unknown``."""
    L, B = prompt_tokens, block_size
    out = Split()
    hit, top = _bounds(L, B, cached if cached is not None else here or 0)
    out.add("hit", hit)
    out.add("partial_block", L - top)
    if here is None:
        out.add("unknown", top - hit)
        return out
    at = hit
    for cause, end in (
        ("evicted" if eviction_evidence else "unknown", here),
        ("elsewhere", best or 0),
    ):
        end = min(max(end, at), top)
        if cause == "elsewhere" and end > at:
            out.elsewhere_replica = best_replica
        out.add(cause, end - at)
        at = end
    if changed_at is not None and previous_tokens:
        start = min(max(changed_at, at), top)
        out.add("cold", start - at)
        end = min(max(previous_tokens, start), top)
        out.add("prefix_changed", end - start)
        at = end
    out.add("cold", top - at)
    return out
