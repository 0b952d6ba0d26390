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
from typing import Any

import msgspec

from prefixgate.record.cut import ITEMS, piece_of, tools_of_list
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


def segments_responses_from_bytes(raw: bytes, *, tools_first: bool = True) -> list[Segment] | None:
    """:func:`segments_responses` of the request whose JSON is ``raw``, without texts,
    each piece looked up by its bytes (an agent resends the same ones every turn); ``None``
    for a body of another shape."""
    try:
        shape = _SHAPE.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    tools = tools_of_list(bytes(shape.tools), "openai")
    if tools is None:
        return None

    def seg(kind: str, name: str, piece: tuple[str, int, Any]) -> Segment:
        return Segment(kind, name, piece[0], piece[1], (piece[1] + 3) // 4)

    head: list[Segment] = []
    rest: list[Segment] = []
    instructions = bytes(shape.instructions)
    if instructions[:1] == b'"':
        digest, chars = DIGESTS.of(canonical_json(msgspec.json.decode(instructions)))
        head.append(seg("system", "instructions", (digest, chars, None)))
    elif instructions != b"null":
        return None
    data = bytes(shape.input)
    if data[:1] == b'"':
        piece = piece_of("input", data, _label)
        rest.append(seg("message", "input:user", piece))
    elif data[:1] == b"[":
        leading = True
        for i, item in enumerate(ITEMS.decode(data)):
            piece = piece_of("item", bytes(item), _label)
            leading = leading and piece[2] in _SYSTEM
            (head if leading else rest).append(
                seg("system" if leading else "message", f"input[{i}]:{piece[2]}", piece)
            )
    else:
        return None
    return tools + head + rest if tools_first else head + tools + rest
