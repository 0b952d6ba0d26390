"""The prompt's segments in the engine's order: where the upstream's chat template really
puts each piece of a chat request, so that segment offsets, "where the prefix broke" and
the cache model's replay are those of the prompt the engine caches.

:func:`rendered_segments` takes a chat request's segments in request order (tools placed
by the template's ``tools`` fact: ``segments_openai`` / ``segments_of_chat``) and the
upstream's :class:`~prefixgate.engine.rendering.Rendering`, and returns them as the
template renders them:

- a template that gathers every system message at the head (``system: hoisted``): each
  later ``role: system`` message moves to the end of the leading system segments, named
  ``messages[i]:system@head`` (kind ``system``), so a new one shows as a change at the head;
- a template that renders an assistant's reasoning only after the last user query
  (``reasoning: until_next_user``): each assistant message before the last user message
  is the message without its reasoning, named ``messages[i]:assistant/no-reasoning`` (the
  rendering that drops it is another prompt than the one that showed it);
- anything else: the segments as they were (the same list, no copy).

This is the one place that says how a request's pieces line up in the engine's prompt;
the capture step (``segments_out``), the miss ledger and the doctor read its result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from prefixgate.engine.rendering import Rendering
from prefixgate.record.record import Segment
from prefixgate.record.segments import canonical_json, segment, stripped, text_sink

__all__ = ["AT_HEAD", "NO_REASONING", "hoisted", "rendered_segments"]

AT_HEAD = "@head"  # a later system message the template renders at the head
NO_REASONING = "/no-reasoning"  # an assistant message the template renders without reasoning
_REASONING = ("reasoning_content", "reasoning")
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.encode


def _index(seg: Segment) -> int | None:
    """``i`` of a segment named ``messages[i]:role``."""
    name = seg.name
    if not name.startswith("messages["):
        return None
    try:
        return int(name[9 : name.index("]")])
    except ValueError:
        return None


def rendered_segments(
    segments: list[Segment],
    rendering: Rendering,
    messages: Sequence[Any] | None = None,
    *,
    texts: dict[str, str] | None = None,
    known: Any = (),
) -> list[Segment]:
    """``segments`` (a chat request's, in request order) in the order and form the
    upstream's template renders them. ``messages``: the request's messages (dicts, texts
    plain or raw), needed for the reasoning rule only; ``texts``/``known`` as in
    :func:`~prefixgate.record.segments.segments_openai` (the texts of the segments made
    here)."""
    out = segments
    if isinstance(messages, msgspec.Raw):  # a chat request's messages as they came
        messages = _decode(messages)
    if rendering.drops_past_reasoning and isinstance(messages, list):
        out = _without_past_reasoning(out, messages, texts, known)
    if rendering.hoists_system:
        out = hoisted(out)
    return out


def hoisted(segments: list[Segment]) -> list[Segment]:
    """Later system messages moved into the system prompt, as a hoisting template renders
    them (named ``…@head``)."""
    later = [
        i for i, s in enumerate(segments) if s.kind == "message" and s.name.endswith(":system")
    ]
    if not later:
        return segments
    moved = [Segment("system", segments[i].name + AT_HEAD, *_rest(segments[i])) for i in later]
    gone = set(later)
    keep = [s for i, s in enumerate(segments) if i not in gone]
    # into the system prompt: after its last leading segment (before the tools that follow
    # it in a system_first template), before the turns
    at = 0
    for i, s in enumerate(keep):
        if s.kind == "message":
            break
        if s.kind == "system":
            at = i + 1
    return keep[:at] + moved + keep[at:]


def _rest(seg: Segment) -> tuple:
    return seg.hash, seg.chars, seg.tokens


def _without_past_reasoning(
    segments: list[Segment], messages: Sequence[Any], texts: dict[str, str] | None, known: Any
) -> list[Segment]:
    last_user = max(
        (i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"),
        default=-1,
    )
    if last_user < 0:
        return segments
    sink = text_sink(texts, known)
    out = list(segments)
    changed = False
    for k, seg in enumerate(segments):
        i = _index(seg)
        if i is None or i >= last_user or not seg.name.endswith(":assistant"):
            continue
        m = messages[i]
        if not isinstance(m, dict) or not any(m.get(key) for key in _REASONING):
            continue
        shown = {key: v for key, v in m.items() if key not in _REASONING}
        data = canonical_json(stripped(_decode(_encode(shown))))
        out[k] = segment(seg.kind, seg.name + NO_REASONING, data, sink)
        changed = True
    return out if changed else segments
