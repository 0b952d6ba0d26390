"""The comparison itself, pure: two requests' recorded segments, in the order the engine
renders them, and where the later one stopped extending the earlier.

Only what the record keeps is read (segment kinds, client names, hashes and token
estimates; never text), so the comparison costs a walk over two lists of a few hundred
segments whatever the prompt's size. :func:`engine_order` is the one place that says in
which order the engine sees a request's segments; the comparison never assumes another.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from prefixgate.record.model import Segment

# What a segment is, as the vendors' reasons name it.
PART = {"tools": "tools", "tool": "tools", "system": "system", "message": "messages"}


def engine_order(segments: Sequence[Segment], *, tools_first: bool) -> list[Segment]:
    """A request's segments as received (named as the client named them) in the order
    the engine's chat template renders them: the tools before or after the leading
    system prompt (the channel's learned ``render_order``), then the conversation. The
    ``tools`` segment (the whole list) stands for its ``tool`` segments, which are left
    out (a reordered list changes it, and one change is reported once)."""
    tools = [s for s in segments if s.kind == "tools"]
    head = [s for s in segments if s.kind == "system"]
    rest = [s for s in segments if s.kind == "message"]
    return tools + head + rest if tools_first else head + tools + rest


class Divergence(NamedTuple):
    """Where ``cur`` stopped extending ``prev``: the part (``tools``, ``system``,
    ``messages``), the segment as the client named it (``None``: the earlier request
    had more segments and this one only dropped the tail), the estimated tokens of
    the common prefix before it, and of the earlier request after it (what could have
    been read from cache had the prefix matched)."""

    part: str
    segment: str | None
    index: int
    prefix_tokens: int
    missed_tokens: int


def diverge(prev: Sequence[Segment], cur: Sequence[Segment]) -> Divergence | None:
    """The first position where ``cur`` differs from ``prev`` (a different kind or
    hash), or None when ``cur`` extends ``prev`` (the turn appended, nothing changed).
    Both lists in the engine's order (:func:`engine_order`)."""
    prefix = 0
    n = min(len(prev), len(cur))
    for i in range(n):
        a, b = prev[i], cur[i]
        if a.kind != b.kind:
            # One section (system, tools) has another number of entries: the one that
            # comes first in the engine's order is the one that changed.
            rank = _ranks(cur, prev)
            first = a if rank[a.kind] < rank[b.kind] else b
            return Divergence(PART[first.kind], first.name, i, prefix, _tokens(prev[i:]))
        if a.hash != b.hash:
            return Divergence(PART[b.kind], b.name, i, prefix, _tokens(prev[i:]))
        prefix += a.tokens
    if len(prev) > n:  # entries removed at the end: a rewind, a compaction
        return Divergence(PART[prev[n].kind], None, n, prefix, 0)
    return None


def _ranks(*lists: Sequence[Segment]) -> dict[str, int]:
    """Each kind's place in the engine's order, as the lists show it (messages last)."""
    rank: dict[str, int] = {}
    for segments in lists:
        for s in segments:
            if s.kind != "message" and s.kind not in rank:
                rank[s.kind] = len(rank)
    rank["message"] = len(rank)
    return rank


def _tokens(segments: Sequence[Segment]) -> int:
    return sum(s.tokens for s in segments)


def total_tokens(segments: Sequence[Segment]) -> int:
    """Estimated tokens of a prompt (its segments in the engine's order)."""
    return _tokens(segments)
