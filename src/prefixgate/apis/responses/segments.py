"""Segments of an OpenAI Responses request, as received (the sent side of a converted
request is a chat request, cut by ``record/cut.py``).

The pieces, in the order a chat template renders the conversation they become: ``tools``
and each ``tool`` (a namespace is one tool), then the system part — ``instructions``
(``system``) and the leading system/developer messages (kind ``system``,
``input[i]:developer``) — then every other item (kind ``message``, ``input[i]:user``,
``input[i]:function_call``, …). A string ``input`` is one message, ``input:user``. Hashes,
sizes and texts are those of ``record/segments.py`` (canonical JSON, blake2b-128), so a
Responses request and the chat request it became compare piece by piece where they hold
the same JSON.
"""

from __future__ import annotations

from collections.abc import Container
from operator import itemgetter
from typing import Any, NamedTuple

import msgspec

from prefixgate.record.cut import ITEMS, Piece, Pieces, piece_of, tools_and_pieces
from prefixgate.record.record import Segment
from prefixgate.record.segments import (
    DIGESTS,
    canonical_json,
    floats_differ,
    openai_tool_name,
    segment,
    stripped,
    text_sink,
    tool_segments,
)
from prefixgate.sequences import common_prefix, same_prefix

_SYSTEM = ("system", "developer")


def _label(item: Any) -> str:
    """What a segment name says of an item: a message's role, else the item's type."""
    if not isinstance(item, dict):
        return "?"
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        return role if isinstance(role, str) else "?"
    return kind if isinstance(kind, str) else "?"


def segments_responses(
    body: dict[str, Any],
    *,
    tools_first: bool = True,
    texts: dict[str, str] | None = None,
    known: Container[str] = (),
) -> list[Segment]:
    """The segments of a decoded Responses request (``texts`` and ``known`` as in
    :func:`~prefixgate.record.segments.segments_anthropic`)."""
    texts_ = text_sink(texts, known)
    exact = not floats_differ(body)
    tools = tool_segments(body.get("tools"), openai_tool_name, texts_, exact)
    head: list[Segment] = []
    rest: list[Segment] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        head.append(segment("system", "instructions", canonical_json(instructions), texts_))
    items = body.get("input")
    if isinstance(items, str):
        rest.append(segment("message", "input:user", canonical_json(items), texts_))
    elif isinstance(items, list):
        leading = True
        for i, item in enumerate(items):
            label = _label(item)
            leading = leading and label in _SYSTEM
            data = canonical_json(stripped(item), floats_checked=exact)
            seg = segment("system" if leading else "message", f"input[{i}]:{label}", data, texts_)
            (head if leading else rest).append(seg)
    return tools + head + rest if tools_first else head + tools + rest


class _Shape(msgspec.Struct):
    tools: msgspec.Raw = msgspec.Raw(b"null")
    input: msgspec.Raw = msgspec.Raw(b"null")
    instructions: msgspec.Raw = msgspec.Raw(b"null")


_SHAPE = msgspec.json.Decoder(_Shape)


def segments_responses_from_bytes(raw: bytes) -> list[Segment] | None:
    """:func:`segments_responses` of the request whose JSON is ``raw``, without texts,
    each piece looked up by its bytes (an agent resends the same ones every turn); ``None``
    for a body of another shape. The segments of :func:`cut_responses`."""
    cut = cut_responses(raw)
    return None if cut is None else cut[0]


_first = itemgetter(0)  # a piece's segment


class _Split(NamedTuple):
    """How :func:`cut_responses` split a request, for the next turn's cut to go on from:
    the tools list's bytes and pieces, the instructions' bytes and piece, each input
    item's bytes and piece (in the items' order), and how many items lead as system ones."""

    tools: bytes
    tools_part: list[Piece]
    instructions: bytes
    head: list[Piece]
    items: list[bytes]
    pieces: list[Piece]
    leading: int


def cut_responses(
    raw: bytes, previous: list[Piece] | None = None
) -> tuple[list[Segment], list[Piece]] | None:
    """:func:`segments_responses_from_bytes` with each segment's JSON bytes (the pieces of
    :func:`~prefixgate.record.cut.pieces_of`), going on from the session's previous
    request as this function cut it (``previous``): the tools list and the instructions
    taken as they were when their bytes are equal, the input items equal to the previous
    ones from the start (found in C) taken as its pieces, only the rest looked up or made.
    Codex CLI re-sends its whole conversation every turn and appends: a turn costs its
    new items. ``None`` for a body of another shape."""
    try:
        shape = _SHAPE.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    data = bytes(shape.input)
    if data[:1] != b"[" and data[:1] != b'"':
        return None
    split = getattr(previous, "split", None)
    before = split if isinstance(split, _Split) else None
    tools = bytes(shape.tools)
    if before is not None and tools == before.tools:
        tool_part = before.tools_part
    else:
        got = tools_and_pieces("openai", tools, [])
        if got is None:
            return None
        tool_part = got
    instructions = bytes(shape.instructions)
    if before is not None and instructions == before.instructions:
        head = before.head
    elif instructions[:1] == b'"':
        digest, chars = DIGESTS.of(canonical_json(msgspec.json.decode(instructions)))
        head = [(Segment("system", "instructions", digest, chars, (chars + 3) // 4), instructions)]
    elif instructions == b"null":
        head = []
    else:
        return None
    k = leading = 0
    pieces: list[Piece] = []
    items: list[bytes] = []
    if data[:1] == b'"':  # the input is one user message
        digest, chars, _ = piece_of("input", data, _label)
        pieces = [(Segment("message", "input:user", digest, chars, (chars + 3) // 4), data)]
    else:
        try:
            items = list(map(bytes, ITEMS.decode(data)))
        except (msgspec.DecodeError, RecursionError):
            return None
    if before is not None and items:
        k = common_prefix(items, before.items)
        items[:k] = before.items[:k]  # the previous bytes kept, these dropped
        pieces = before.pieces[:k]
        leading = min(k, before.leading)
    lead = leading == k  # the items so far all lead
    for i in range(k, len(items)):
        item = items[i]
        digest, chars, label = piece_of("item", item, _label)
        lead = lead and label in _SYSTEM
        leading += lead
        kind = "system" if lead else "message"
        seg = Segment(kind, f"input[{i}]:{label}", digest, chars, (chars + 3) // 4)
        pieces.append((seg, item))
    front = head + pieces[:leading]
    whole = tool_part + front + pieces[leading:]
    segs = list(map(_first, whole))  # (in C: a Codex turn holds hundreds)
    out = Pieces(whole[1:] if tool_part else whole)
    if before is not None and previous is not None:
        out.same = same_prefix(out, previous)
        out.base = previous
    out.split = _Split(tools, tool_part, instructions, head, items, pieces, leading)
    return segs, out
