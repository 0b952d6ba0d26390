"""Segments cut from a request's JSON bytes: the segments of ``segments.py``, computed
from the bytes of a request instead of its decoded object, with each piece's bytes (for
the change memory, ``changes.py``), and the chat request the gateway built cut as it was
built.

Each tool, system block and message is cut out of the bytes as it came (``msgspec.Raw``, no
Python objects for its contents) and looked up by those bytes: an agent sends the same
tools, system prompt and history every turn, so nearly every piece was seen the turn
before and only the new ones are decoded, stripped and hashed (by ``segments.py``'s
functions, so the result is the same). Bodies of another shape (a ``tools`` that is not an
array, say) go the object way.
"""

from __future__ import annotations

from itertools import compress
from operator import is_not, itemgetter
from typing import Any, NamedTuple

import msgspec

from prefixgate.record.record import Segment
from prefixgate.record.segments import (
    DIGESTS,
    BytesMemo,
    anthropic_tool_label,
    canonical_of,
    openai_tool_label,
    role_of,
)
from prefixgate.sequences import common_prefix


class _Shape(msgspec.Struct):
    """What the segments are cut from, in one pass over the bytes."""

    tools: msgspec.Raw = msgspec.Raw(b"null")  # the whole list: looked up as one piece
    messages: list[msgspec.Raw] | None = None
    system: msgspec.Raw = msgspec.Raw(b"null")
    input: msgspec.Raw = msgspec.Raw(b"null")  # a Responses request (only pieces_of reads it)
    instructions: msgspec.Raw = msgspec.Raw(b"null")


_SHAPE = msgspec.json.Decoder(_Shape)
ITEMS = msgspec.json.Decoder(list[msgspec.Raw])


class _Pieces(BytesMemo):
    """(digest, chars, label) of a tool, block or message by its bytes as sent (the
    label: a tool's name or a message's role), or of the tool list by its tools' digests."""

    def __init__(self, budget: int = 8 * 1024 * 1024) -> None:
        super().__init__(budget)


_PIECES = _Pieces()


def piece_of(tag: str, raw: bytes, label_of) -> tuple[str, int, str | None]:
    def make() -> tuple[str, int, str | None]:
        obj, data = canonical_of(raw)
        digest, chars = DIGESTS.of(data)
        return digest, chars, label_of(obj)

    return _PIECES.get(tag, raw, make)


def tools_of_list(data: bytes, api: str) -> list[Segment] | None:
    """The tool segments of a tools list's JSON (``None`` if it is not a list). An agent
    sends the same list every turn: it is looked up whole (one fingerprint and one compare
    for the dozen tools), and cut into tools only when not seen recently."""
    if data[:1] != b"[":
        return [] if data == b"null" else None
    try:
        segs = _PIECES.get(
            f"tool-list:{api}", data, lambda: tuple(_tools_from_raw(ITEMS.decode(data), api))
        )
    except (msgspec.DecodeError, RecursionError):
        return None
    return list(segs)


def _tools_from_raw(raws: list[msgspec.Raw] | None, api: str) -> list[Segment]:
    if not raws:
        return []
    items = [bytes(t) for t in raws]
    label_of = anthropic_tool_label if api == "anthropic" else openai_tool_label
    pieces = [piece_of(f"tool:{api}", t, label_of) for t in items]  # label: the name, or None

    def whole() -> tuple[str, int, str | None]:
        # The list's canonical JSON is its items' canonical JSON joined (compact separators).
        parts = [canonical_of(t)[1] for t in items]
        digest, chars = DIGESTS.of(b"[" + b",".join(parts) + b"]")
        return digest, chars, None

    # The list is known by its tools' digests (their canonical bytes, so its own).
    key = " ".join(p[0] for p in pieces).encode()
    digest, chars, _ = _PIECES.get("tools", key, whole)
    out = [Segment("tools", "tools", digest, chars, (chars + 3) // 4)]
    for i, (digest, chars, name) in enumerate(pieces):
        name = f"tools[{i}]" if name is None else name  # a tool without a name: its position
        out.append(Segment("tool", name, digest, chars, (chars + 3) // 4))
    return out


def _no_label(_obj: Any) -> str:
    return ""


def segments_from_bytes(
    raw: bytes, api: str, *, tools_first: bool | None = None
) -> list[Segment] | None:
    """:func:`segments_anthropic` (``api="anthropic"``) or :func:`segments_openai` of the
    request whose JSON is ``raw``, without texts; ``None`` for a body of another shape
    (the caller then uses those functions)."""
    cut = cut_from_bytes(raw, api, tools_first=tools_first)
    return None if cut is None else cut[0]


Piece = tuple[Segment, bytes]


def cut_from_bytes(
    raw: bytes,
    api: str,
    *,
    tools_first: bool | None = None,
    previous: list[Piece] | None = None,
) -> tuple[list[Segment], list[Piece]] | None:
    """:func:`segments_from_bytes` and :func:`pieces_of` together, from one pass over the
    bytes: the segments, and each one's JSON bytes (the ``tools`` list left out).

    ``previous``: the pieces of the session's previous request in the same API. An agent
    re-sends its conversation every turn, so each message, the tools and the system
    blocks are first compared with what stood at the same place the turn before (one
    memcmp): when equal, the previous segment and bytes are taken as they are, without a
    copy or a lookup; only what is new is cut, decoded and hashed. A piece that differs
    (a moved marker, an edited message) is computed as if nothing came before."""
    if tools_first is None:
        tools_first = api == "openai"
    try:
        shape = _SHAPE.decode(raw)
    except (msgspec.DecodeError, RecursionError):  # ValidationError: another shape
        return None
    return _cut(api, bytes(shape.tools), shape.messages, shape.system, tools_first, previous)


def cut_from_pieces(
    pieces: tuple[bytes, bytes, list[bytes]],
    api: str,
    *,
    tools_first: bool | None = None,
    previous: list[Piece] | None = None,
    same: tuple[list[bytes], int] | None = None,
) -> tuple[list[Segment], list[Piece]] | None:
    """:func:`cut_from_bytes` of a request whose parts the decode cut already
    (``MessagesBody.pieces``: the tools list's, the system's and each message's JSON
    bytes): the same result, without a pass over the body. ``same``: a list of message
    bytes and how many leading messages are its very objects (``MessagesBody.lent``)."""
    if tools_first is None:
        tools_first = api == "openai"
    tools, system, messages = pieces
    return _cut(api, tools, messages, system, tools_first, previous, same)


def pieces_of(raw: bytes, segs: list[Segment]) -> list[tuple[Segment, bytes]] | None:
    """The JSON bytes of each segment of ``segs`` (the segments of the request ``raw``,
    either API; the whole ``tools`` list left out), as they are in ``raw``; ``None`` when
    ``raw`` is not of the shape the segments were cut from."""
    try:
        shape = _SHAPE.decode(raw)
        tools_raw = bytes(shape.tools)
        tools = [bytes(t) for t in ITEMS.decode(tools_raw)] if tools_raw[:1] == b"[" else []
        system = bytes(shape.system)
        blocks = [bytes(b) for b in ITEMS.decode(system)] if system[:1] == b"[" else []
        given = bytes(shape.input)  # a Responses request's input (apis/responses/segments.py)
        items = [bytes(i) for i in ITEMS.decode(given)] if given[:1] == b"[" else []
    except (msgspec.DecodeError, RecursionError):
        return None
    messages = shape.messages or []
    out: list[tuple[Segment, bytes]] = []
    k = 0
    try:
        for seg in segs:
            name = seg.name
            if seg.kind == "tools":
                continue
            if seg.kind == "tool":
                data = tools[k]
                k += 1
            elif name.startswith("messages["):
                data = bytes(messages[int(name[9 : name.index("]")])])
            elif name == "system":
                data = system
            elif name.startswith("system["):
                data = blocks[int(name[7:-1])]
            elif name.startswith("input["):
                data = items[int(name[6 : name.index("]")])]
            elif name == "input:user":
                data = given
            elif name == "instructions":
                data = bytes(shape.instructions)
            else:
                return None
            out.append((seg, data))
    except (IndexError, ValueError):
        return None
    return out


def segments_of_chat(body: dict[str, Any], *, tools_first: bool = True) -> list[Segment]:
    """:func:`segments_from_bytes` of the chat request the gateway built (its texts may be
    ``msgspec.Raw``), without encoding it whole and cutting it up again: each tool and
    message is encoded alone, which gives the very bytes it has in the whole."""
    return cut_of_chat(body, tools_first=tools_first)[0]


class ChatCut(NamedTuple):
    """A chat request the gateway built, as cut: the objects it was built of (its
    messages and its tools list) and what each was cut into, for the next turn to
    borrow. A message's bytes are kept only while it leads as a system message (the
    change memory compares the conversation by its hashes)."""

    messages: list
    pieces: list[tuple[Segment, bytes | None]]
    tools: Any
    tools_part: list[Piece]
    size: int  # ≈ bytes the kept objects hold
    chars: int = 0  # the messages' pieces' characters
    leading: int = 0  # how many messages lead as system ones
    segs: list[Segment] | None = None  # the segments (the tools', the leading, the rest)
    tools_first: bool = True
    lead: list[Segment] | None = None  # the leading messages' segments, of kind system


def cut_of_chat(
    body: dict[str, Any], *, tools_first: bool = True, previous: ChatCut | None = None
) -> tuple[list[Segment], list[Piece], ChatCut]:
    """:func:`segments_of_chat` with each piece's bytes (as :func:`cut_from_bytes`, but
    ``None`` for the messages after the leading system ones), and what the next turn
    borrows from. ``previous``: the session's previous request as cut.
    The conversion lends a message it converted before as the very object
    (:class:`~prefixgate.apis.messages.request.SessionTurns`): the same object at the same
    place is the same bytes, so its piece is taken as it was, without encoding it; any
    other is encoded alone and cut as if nothing came before. The messages lent are found
    in C and taken as slices of the previous cut's lists; only the others are walked.
    The pieces (a :class:`Pieces`) say in ``runs`` which of them are, at the same
    places, the previous turn's very pieces."""
    tools = body.get("tools")
    messages = body["messages"]
    before = previous.messages if previous is not None else ()
    n = min(len(before), len(messages))
    # the messages that are not the previous turn's at the same place, and the new ones
    other = list(compress(range(n), map(is_not, messages, before))) if n else []
    other += range(n, len(messages))
    msgs: list[Any] = previous.pieces[:n] if previous is not None else []
    chars = size = 0
    if previous is not None:
        chars = previous.chars - sum([p[0].chars for p in previous.pieces[n:]])
        chars -= sum([previous.pieces[i][0].chars for i in other if i < n])
        size = chars
    for i in other:
        m = messages[i]
        data = _encode(m)
        got = piece_of("message", data, role_of)
        piece = (_seg("message", f"messages[{i}]:{got[2]}", got), data)
        if i < n:
            msgs[i] = piece
        else:
            msgs.append(piece)
        size += len(data)
        chars += got[1]
    if previous is not None and tools and tools is previous.tools:
        tools_part = previous.tools_part
    else:
        tools_part = tools_and_pieces("openai", _encode(tools) if tools else b"null", [])
    assert tools_part is not None  # (a list of tools, or none)
    leading = _leading(msgs)
    for i in range(leading):  # a lent message that leads now: its bytes
        if msgs[i][1] is None:
            msgs[i] = (msgs[i][0], _encode(messages[i]))
    # the conversation's bytes are not kept: the change memory compares it by its hashes
    # (a lent piece past the previous leading ones holds none already)
    was = previous.leading if previous is not None else 0
    for i in (*range(leading, max(leading, was)), *other):
        if i >= leading and msgs[i][1] is not None:
            msgs[i] = (msgs[i][0], None)
    first = next((i for i in other if i >= leading), len(msgs))  # the rest lent up to it
    # the leading messages as system segments: the previous turn's very ones where equal
    # (a segment made anew each turn would end what the next stages take by identity)
    was_lead = previous.lead if previous is not None and previous.lead is not None else []
    lead = [p if p[0].kind == "system" else (_as(p[0], "system"), p[1]) for p in msgs[:leading]]
    for i in range(min(len(lead), len(was_lead))):
        if lead[i][0] is not was_lead[i] and lead[i][0] == was_lead[i]:
            lead[i] = (was_lead[i], lead[i][1])
    tools_segs = list(map(_first, tools_part))
    lead_segs = list(map(_first, lead))
    tool_pieces = tools_part[1:]
    front = tools_segs + lead_segs if tools_first else lead_segs + tools_segs
    # the messages' segments after the front: the previous turn's up to the first other
    # message (taken with its front, which this one's takes the place of: one copy)
    if previous is not None and previous.segs is not None and leading == was:
        off = was + len(previous.tools_part)
        j = min(first, len(previous.segs) - off + leading) - leading
        segs = previous.segs[: off + j]
        segs[:off] = front
    else:
        segs, j = front, 0
    segs += map(_first, msgs[leading + j :])
    # the messages' pieces (of kind ``message``) after the front, which takes the place
    # of the leading ones (a slice of them added would be one more copy)
    pieces = Pieces(msgs)
    pieces[:leading] = tool_pieces + lead if tools_first else lead + tool_pieces
    if previous is not None:
        aligned = leading == was and tools_first == previous.tools_first
        tools_same = len(tool_pieces) if aligned and tools_part is previous.tools_part else 0
        at = 0 if tools_first else len(lead)
        start = len(lead) + len(tool_pieces)
        if not aligned or len(tools_part) != len(previous.tools_part):
            same = 0
        else:
            same = min(first, len(previous.pieces)) - leading
        pieces.runs = [(a, a + k) for a, k in ((at, tools_same), (start, same)) if k > 0]
        pieces.base = previous
    size += 64 * len(msgs) + sum(map(len, filter(None, map(_second, tools_part))))
    cut = ChatCut(
        messages, msgs, tools, tools_part, size, chars, leading, segs, tools_first, lead_segs
    )
    return segs, pieces, cut


_encode = msgspec.json.encode
_first, _second = itemgetter(0), itemgetter(1)  # of a piece: its segment, its bytes


def _same_list(data: bytes, previous: list[Piece]) -> bool:
    """Whether a JSON array's bytes are the previous pieces' bytes, as one array."""
    return len(data) == 1 + len(previous) + sum(len(p[1]) for p in previous) and (
        data == b"[" + b",".join([p[1] for p in previous]) + b"]"
    )


def _equal(raw: msgspec.Raw | bytes, data: bytes) -> bool:
    """``raw``'s bytes are ``data`` (a memcmp; a memoryview would compare byte by byte)."""
    return raw == data if type(raw) is bytes else raw == msgspec.Raw(data)


def _seg(kind: str, name: str, piece: tuple[str, int, str | None]) -> Segment:
    return Segment(kind, name, piece[0], piece[1], (piece[1] + 3) // 4)


def tools_and_pieces(api: str, tools_list: bytes, prev_tools: list[Piece]) -> list[Piece] | None:
    """The ``tools`` segment and each tool's piece (``None``: not a list)."""
    tools = tools_of_list(tools_list, api)
    if tools is None:
        return None
    if tools and prev_tools and _same_list(tools_list, prev_tools):
        tool_pieces = [(seg, p[1]) for seg, p in zip(tools[1:], prev_tools, strict=True)]
    elif tools:
        tool_pieces = [
            (seg, bytes(t)) for seg, t in zip(tools[1:], ITEMS.decode(tools_list), strict=True)
        ]
    else:
        tool_pieces = []
    return [(tools[0], b""), *tool_pieces] if tools else []


def _leading(msgs: list[Piece]) -> int:
    """How many of a chat request's messages lead as system or developer messages."""
    leading = 0
    while leading < len(msgs) and msgs[leading][0].name.endswith((":system", ":developer")):
        leading += 1
    return leading


def _chat_order(
    tools_part: list[Piece], msgs: list[Piece], tools_first: bool, leading: int
) -> list[Piece]:
    """A chat request's pieces in request order, its leading messages of kind ``system``."""
    lead = [p if p[0].kind == "system" else (_as(p[0], "system"), p[1]) for p in msgs[:leading]]
    rest = [p if p[0].kind == "message" else (_as(p[0], "message"), p[1]) for p in msgs[leading:]]
    return tools_part + lead + rest if tools_first else lead + tools_part + rest


def _pieces(whole: list[Piece]) -> list[Piece]:
    return [p for p in whole if p[0].kind != "tools"]


class Pieces(list):
    """A request's pieces as received (:data:`Piece` each), with how the cut split them,
    for the next turn's cut to go on from (``split``: its tools bytes, system bytes and
    messages' bytes, its segments, how many pieces lead the messages); ``same``: how many
    leading pieces are the previous request's very pieces (set by the cut that lent them,
    cleared by the change memory once it used it)."""

    __slots__ = ("split", "same", "base", "runs")

    def __init__(self, items=(), split=None, same: int = 0, base=None) -> None:
        super().__init__(items)
        self.split = split
        self.same = same
        self.base = base  # what ``same`` (or ``runs``) counts in
        self.runs: list[tuple[int, int]] = []  # the chat cut's: (start, end) lent as they were


def _cut(
    api: str,
    tools_list: bytes,
    messages_raw,
    system_raw,
    tools_first: bool,
    previous: list[Piece] | None,
    same: tuple[list[bytes], int] | None = None,
) -> tuple[list[Segment], list[Piece]] | None:
    split = getattr(previous, "split", None)
    if (
        split is not None
        and api == "anthropic"
        and split[0] == tools_first
        and type(messages_raw) is list
        and type(system_raw) is bytes
    ):
        return _cut_on(previous, split, tools_list, messages_raw, system_raw, same)  # type: ignore[arg-type]
    prev_tools: list[Piece] = []
    prev_blocks: list[Piece] = []
    prev_messages: list[Piece] = []  # in their order: messages[0], messages[1] …
    for p in previous or ():
        seg = p[0]
        if seg.kind == "tool":
            prev_tools.append(p)
        elif seg.name.startswith("messages["):
            prev_messages.append(p)
        elif seg.kind == "system":
            prev_blocks.append(p)
    tools_part = tools_and_pieces(api, tools_list, prev_tools)
    if tools_part is None:
        return None
    msgs = _messages(messages_raw or (), prev_messages)

    if api == "anthropic":
        head = _head(system_raw, prev_blocks)
        if head is None:
            return None
        whole = tools_part + head if tools_first else head + tools_part
        lead = len(whole)
        whole += msgs
        segs = list(map(_first, whole))
        if type(messages_raw) is list and type(system_raw) is bytes:  # lent by the decode
            # (its list of each message's bytes kept as it is: the decode does not change
            # a list it made, and a copy would write to each item)
            split = (
                tools_first,
                tools_list,
                tools_part,
                system_raw,
                head,
                messages_raw,
                segs,
                lead,
            )
            return segs, Pieces(_pieces(whole), split)
        return segs, _pieces(whole)
    whole = _chat_order(tools_part, msgs, tools_first, _leading(msgs))
    return list(map(_first, whole)), _pieces(whole)


def _messages(messages_raw, prev: list[Piece], skip: int = 0, start: int = 0) -> list[Piece]:
    """The pieces of ``messages_raw[start:]``: a message whose bytes equal the previous
    request's at the same place (its messages' pieces: ``prev[skip:]``, not sliced) takes
    its piece."""
    msgs: list[Piece] = []
    n = len(prev) - skip
    for i in range(start, len(messages_raw)):
        m = messages_raw[i]
        if i < n:
            before = prev[skip + i]
            was = before[1]
            if m is was or (len(was) == len(m) and _equal(m, was)):
                msgs.append(before)
                continue
        data = bytes(m)
        piece = piece_of("message", data, role_of)
        msgs.append((_seg("message", f"messages[{i}]:{piece[2]}", piece), data))
    return msgs


def _head(system_raw, prev_blocks: list[Piece]) -> list[Piece] | None:
    """An Anthropic request's system pieces (``None``: not of the shape)."""
    head: list[Piece] = []
    system = bytes(system_raw)
    if system[:1] == b'"':
        head.append((_seg("system", "system", piece_of("system", system, _no_label)), system))
    elif system[:1] == b"[":
        if prev_blocks and prev_blocks[0][0].name != "system" and _same_list(system, prev_blocks):
            head = list(prev_blocks)
        else:
            for i, block in enumerate(ITEMS.decode(system)):
                data = bytes(block)
                piece = piece_of("block", data, _no_label)
                head.append((_seg("system", f"system[{i}]", piece), data))
    elif system != b"null":
        return None
    return head


def _cut_on(
    previous: Pieces,
    split: tuple,
    tools_list: bytes,
    messages_raw: list,
    system: bytes,
    same: tuple[list[bytes], int] | None = None,
) -> tuple[list[Segment], list[Piece]] | None:
    """:func:`_cut` of an Anthropic request lent by the decode, going on from the
    session's previous request as this cut split it: the tools list and the system taken
    as they were when their bytes are equal; the messages equal to the previous ones from
    the start (compared in C) taken as a slice of its pieces and segments; only the rest
    walked, as the cut does. The result is the cut's without ``previous``'s split."""
    tools_first, ptools, ptools_part, psystem, phead, praw, psegs, plead = split
    if tools_list is ptools or tools_list == ptools:
        tools_part = ptools_part
    else:
        got = tools_and_pieces(
            "anthropic", tools_list, [p for p in ptools_part if p[0].kind == "tool"]
        )
        if got is None:
            return None
        tools_part = got
    if system is psystem or system == psystem:
        head = phead
    else:
        got = _head(system, [p for p in phead if p[0].kind == "system"])
        if got is None:
            return None
        head = got
    front = tools_part + head if tools_first else head + tools_part
    lead = len(front)
    # the messages equal to the previous ones from the start: told by the decode when it
    # lent them from the same list (a list compared with a longer one is copied first)
    k = same[1] if same is not None and same[0] is praw else common_prefix(messages_raw, praw)
    skip = plead - (1 if ptools_part else 0)  # where the messages start in the pieces
    # (the previous pieces are not sliced but where taken: a list's copy writes to each item)
    tail = _messages(messages_raw, previous, skip, k)
    if tools_part is ptools_part and head is phead:  # the front and k messages as they were
        segs = psegs[: lead + k]
        segs += map(_first, tail)
        pieces = Pieces(previous[: skip + k], None, skip + k, previous)
        pieces += tail
    else:
        whole = front + previous[skip : skip + k] + tail
        segs = list(map(_first, whole))
        pieces = Pieces(_pieces(whole))
    pieces.split = (
        tools_first,
        tools_list,
        tools_part,
        system,
        head,
        messages_raw,
        segs,
        lead,
    )
    return segs, pieces


def _as(seg: Segment, kind: str) -> Segment:
    return seg if seg.kind == kind else Segment(kind, seg.name, seg.hash, seg.chars, seg.tokens)
