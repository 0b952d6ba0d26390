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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prefixgate.cache.blocks import hit_tokens_cap
from prefixgate.events.history import BlockAt

__all__ = ["Split", "split_events", "split_model"]


@dataclass
class Split:
    parts: dict[str, int] = field(default_factory=dict)
    index_predicted: int | None = None
    elsewhere_replica: str | None = None
    host_hit: int = 0
    host_missed: int = 0

    def add(self, cause: str, tokens: int) -> None:
        if tokens > 0:
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
    for i in range(hit // B, -(-top // B)):
        lo, hi = max(i * B, hit), min((i + 1) * B, top)
        cause = _cause(i, mine, others, t, t_end, prev_blocks, broke, where)
        if broke is None:
            broke = cause
        if i < len(mine) and mine[i].host and not mine[i].gpu:
            out.host_missed += hi - lo
        out.add(cause, hi - lo)
    if where:
        out.elsewhere_replica = where.most_common(1)[0][0]
    return out


def _cause(
    i: int,
    mine: Sequence[BlockAt],
    others: Mapping[str, Sequence[BlockAt]],
    t: float,
    t_end: float,
    prev_blocks: int,
    broke: str | None,
    where: Counter[str],
) -> str:
    if i >= len(mine):  # the engine's prompt is longer than the tokens asked of the index
        return "unknown"
    b = mine[i]
    if b.held:
        if b.removed_at is not None and t < b.removed_at <= t_end:
            return "evicted"  # removed while the request waited for the engine
        return broke or "unknown"
    if b.removed_at is not None and b.removed_at <= t:
        return "evicted"
    gone_elsewhere = False
    for name, blocks in others.items():
        if i < len(blocks):
            o = blocks[i]
            if o.held:
                where[name] += 1
                return "elsewhere"
            if o.removed_at is not None and o.removed_at <= t:
                gone_elsewhere = True
    if gone_elsewhere:
        return "evicted"
    return "prefix_changed" if i < prev_blocks else "cold"


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
) -> Split:
    """The split from the cache model: ``here`` the tokens the serving replica's model
    would hit had it never evicted, ``best`` the most another replica's model would hit
    (``None`` both without segments: what did not hit is then ``unknown``);
    ``changed_at`` the token offset where this prompt first differs from the session's
    previous one (``None``: it does not)."""
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
        ("evicted", here),
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
