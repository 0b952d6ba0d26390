"""The comparison itself, pure: two requests' recorded segments, in the order the engine
renders them, and where the later one stopped extending the earlier.

Only what the record keeps is read (segment kinds, client names, hashes and token
estimates; never text), so the comparison costs a walk over two lists of a few hundred
segments whatever the prompt's size (a list comparison in C when nothing diverged, the
common case). :func:`engine_order` is the one place that says in which order the engine
sees a request's segments; the comparison never assumes another.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from prefixgate.record.record import Segment
from prefixgate.record.rendered import hoisted

# What a segment is, as the vendors' reasons name it.
PART = {"tools": "tools", "tool": "tools", "system": "system", "message": "messages"}


def engine_order(
    segments: list[Segment], *, tools_first: bool, hoists_system: bool = False
) -> list[Segment]:
    """A request's segments as received (named as the client named them) in the order
    the engine's chat template renders them: the tools (the ``tools`` list, then each
    ``tool``) before or after the leading system prompt (the channel's learned
    ``render_order``), then the conversation. With ``hoists_system`` (a template that
    gathers every ``role: system`` message into the system prompt, and a channel that
    delivers them as they came), each later system message is part of the system prompt,
    after its leading segments, named ``…:system@head``. The list itself when it is in
    that order already (only its head, before the first message, is read to know)."""
    if hoists_system:
        segments = hoisted(segments)
    first_tools = first_system = None
    head = 0
    for s in segments:
        kind = s.kind
        if kind == "message":
            break
        if kind == "system":
            if first_system is None:
                first_system = head
        elif first_tools is None:
            first_tools = head
        head += 1
    if first_tools is None or first_system is None:
        return segments
    if (first_tools < first_system) == tools_first:
        return segments
    tools = [s for s in segments[:head] if s.kind != "system"]
    system = [s for s in segments[:head] if s.kind == "system"]
    front = tools + system if tools_first else system + tools
    return front + segments[head:]


class Divergence(NamedTuple):
    """Where ``cur`` stopped extending ``prev``: the part (``tools``, ``system``,
    ``messages``), the segment as the client named it (``None``: the earlier request
    had more segments and this one only dropped the tail), its position, the estimated
    tokens of the common prefix before it, and of the earlier request after it (what
    could have been read from cache had the prefix matched)."""

    part: str
    segment: str | None
    index: int
    prefix_tokens: int
    missed_tokens: int


def diverge(prev: list[Segment], cur: list[Segment]) -> Divergence | None:
    """The first position where ``cur`` differs from ``prev`` (a different kind or
    hash), or None when ``cur`` extends ``prev`` (the turn appended, nothing changed).
    Both lists in the engine's order (:func:`engine_order`)."""
    n = min(len(prev), len(cur))
    same = prev == cur[:n] if n == len(prev) else prev[:n] == cur
    if same:  # compared in C: the common case, a turn that appended
        if len(prev) > n:  # entries removed at the end: a rewind, a compaction
            return Divergence(PART[prev[n].kind], None, n, tokens(prev[:n]), 0)
        return None
    for i in range(n):
        a, b = prev[i], cur[i]
        if a == b:
            continue
        if a.kind != b.kind:
            # One section (system, tools) has another number of entries: the one that
            # comes first in the engine's order is the one that changed.
            rank = _ranks(cur, prev)
            first = a if rank[a.kind] < rank[b.kind] else b
        elif a.hash != b.hash:
            first = b
        else:
            continue  # the same content under another name
        return Divergence(PART[first.kind], first.name, i, tokens(prev[:i]), tokens(prev[i:]))
    return None


def _ranks(*lists: Sequence[Segment]) -> dict[str, int]:
    """Each kind's place in the engine's order, as the lists show it (messages last;
    a tool with its list)."""
    rank: dict[str, int] = {}
    for segments in lists:
        for s in segments:
            if s.kind == "message":
                break
            if s.kind not in rank:
                rank[s.kind] = len(rank)
    if "tools" in rank:
        rank["tool"] = rank["tools"]
    rank["message"] = len(rank) + 1
    return rank


def tokens(segments: Sequence[Segment]) -> int:
    """Estimated tokens of a run of segments (a ``tool`` is part of its ``tools`` list and
    is not counted twice)."""
    return sum(s.tokens for s in segments if s.kind != "tool")
