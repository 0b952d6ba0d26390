"""Segment capture: a request's prompt cut into ordered, hashed pieces.

A segment is one tool definition, one system block or one message (plus the whole tool
list as one segment), in the order the upstream renders them into its prompt (whether the
tools come before or after the system prompt depends on the upstream: ``tools_first``). Its hash is
the blake2b-128 hex digest of its canonical JSON::

    json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))

with every ``cache_control`` key removed where the APIs allow one (tool definitions, system
blocks, message content blocks and the blocks inside a tool result): Claude Code moves its
cache marker every turn without changing the content. ``tokens`` is ``ceil(chars / 4)``.

Comparing the segment lists of two consecutive requests of a session says where the
prompt prefix stopped matching (:func:`first_changed`), which is where the upstream's
prefix cache stopped hitting.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Container, Iterable
from typing import Any, NamedTuple

import msgspec

from prefixgate.record.model import Segment
from prefixgate.record.redact import redact

_encode_sorted = msgspec.json.Encoder(order="sorted").encode
_encode_float = msgspec.json.encode
# msgspec's sorted compact JSON equals json.dumps(sort_keys, ensure_ascii=False, compact)
# for everything but some floats: exponent forms (msgspec "1e16", "1e-7" where Python
# writes "1e+16", "1e-07") and non-finite ones (msgspec "null", Python "NaN"). An object
# holding such a float is encoded with json.dumps instead. Finding them is a walk over the
# object's containers (most agent requests hold no float at all), not a scan of its text.
_FLOAT_OR_CONTAINER = frozenset((dict, list, float))


def _floats_differ(obj: Any) -> bool:
    """Whether ``obj`` holds a float that msgspec writes differently from json.dumps."""
    level = [obj]
    while level:
        nxt: list = []
        for node in level:
            t = type(node)
            if t is float:
                if _encode_float(node) != float.__repr__(node).encode():
                    return True
            elif t is dict:
                nxt.extend(node.values())
            elif t is list:
                nxt.extend(node)
        level = [v for v in nxt if type(v) in _FLOAT_OR_CONTAINER]
    return False


def canonical_json(obj: Any, *, floats_checked: bool = False) -> bytes:
    """The canonical JSON of ``obj`` as UTF-8 bytes (the hashed form).
    ``floats_checked``: the caller walked a whole that holds ``obj`` and found no float
    that msgspec writes differently (one walk per request, not one per segment)."""
    try:
        data = _encode_sorted(obj)
    except (TypeError, ValueError, OverflowError, UnicodeEncodeError):
        data = None
    if data is None or (not floats_checked and _floats_differ(obj)):
        text = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        data = text.encode("utf-8", "surrogatepass")
    return data


def _chars(data: bytes) -> int:
    return len(data) if data.isascii() else len(data.decode("utf-8", "surrogatepass"))


class _Texts:
    """Where captured texts go: ``out`` (hash -> redacted text), skipping ``known``."""

    __slots__ = ("out", "known")

    def __init__(self, out: dict[str, str], known: Container[str]) -> None:
        self.out = out
        self.known = known


def _sink(texts: dict[str, str] | None, known: Container[str]) -> _Texts | None:
    return None if texts is None else _Texts(texts, known)


class _BytesMemo:
    """Values by the bytes they were computed from, least recently used first out, within
    a byte budget (an entry costs its bytes and ``ENTRY``). The dict is keyed by a
    fingerprint of the bytes (a tag, the length, and 64 bytes each of the head, middle and
    tail: cheap to hash at any size, where hashing all the bytes costs as much as a pass
    over them), and a hit is confirmed by comparing the bytes in full (a memcmp). Bytes
    with the same fingerprint as an entry's but other contents replace it: look-alikes,
    crafted or not, cost a miss, never a probe chain."""

    ENTRY = 240  # bytes an entry costs beyond its data: the dict slot, the tuples, the str
    _WHOLE = 192  # up to this size, the bytes themselves are the fingerprint

    def __init__(self, budget: int) -> None:
        self._d: OrderedDict[tuple, tuple[bytes, Any]] = OrderedDict()
        self._bytes = 0
        self.budget = budget

    def get(self, tag: str, data: bytes, make):
        n = len(data)
        if n <= self._WHOLE:
            key: tuple = (tag, data)
        else:
            mid = n // 2
            key = (tag, n, data[:64], data[mid - 32 : mid + 32], data[-64:])
        hit = self._d.get(key)
        if hit is not None:
            if hit[0] is data or hit[0] == data:
                self._d.move_to_end(key)
                return hit[1]
            del self._d[key]  # a look-alike: replaced
            self._bytes -= len(hit[0]) + self.ENTRY
        value = make()
        self._d[key] = (data, value)
        self._bytes += n + self.ENTRY
        while self._bytes > self.budget and self._d:
            _, (old, _) = self._d.popitem(last=False)
            self._bytes -= len(old) + self.ENTRY
        return value


class _Digests(_BytesMemo):
    """Digest and size of canonical segment bytes seen recently. An agent sends the same
    tools, system prompt and history again every turn: looking the bytes up costs a
    fraction of blake2b and the character count. Only for segments long enough to be
    worth it."""

    MIN = 2048

    def __init__(self, budget: int = 2 * 1024 * 1024) -> None:
        super().__init__(budget)

    def of(self, data: bytes) -> tuple[str, int]:
        if len(data) < self.MIN:
            return _digest(data)
        return self.get("", data, lambda: _digest(data))


def _digest(data: bytes) -> tuple[str, int]:
    return hashlib.blake2b(data, digest_size=16).hexdigest(), _chars(data)


_DIGESTS = _Digests()


def _segment(kind: str, name: str, data: bytes, texts: _Texts | None) -> Segment:
    digest, chars = _DIGESTS.of(data)
    if texts is not None and digest not in texts.out and digest not in texts.known:
        texts.out[digest] = redact(data.decode("utf-8", "surrogatepass"))
    return Segment(kind, name, digest, chars, (chars + 3) // 4)


def _strip(obj: Any) -> Any:
    """``obj`` without ``cache_control``, also in its nested ``content`` blocks. Returns
    ``obj`` itself when there is nothing to remove (no copy on the common path)."""
    if isinstance(obj, dict):
        content = obj.get("content")
        new_content = _strip_list(content) if isinstance(content, list) else content
        if "cache_control" in obj or new_content is not content:
            obj = {k: v for k, v in obj.items() if k != "cache_control"}
            if new_content is not content:
                obj["content"] = new_content
    return obj


def _strip_list(items: list[Any]) -> list[Any]:
    stripped = [_strip(item) for item in items]
    if any(a is not b for a, b in zip(stripped, items, strict=True)):
        return stripped
    return items


def _tool_segments(tools: Any, name_of: Any, texts: _Texts | None, exact: bool) -> list[Segment]:
    if not isinstance(tools, list) or not tools:
        return []
    parts = [canonical_json(_strip(tool), floats_checked=exact) for tool in tools]
    # The list's canonical JSON is its items' canonical JSON joined (compact separators).
    out = [_segment("tools", "tools", b"[" + b",".join(parts) + b"]", texts)]
    for i, (tool, data) in enumerate(zip(tools, parts, strict=True)):
        out.append(_segment("tool", name_of(tool, i), data, texts))
    return out


def _anthropic_tool_label(tool: Any) -> str | None:
    name = tool.get("name") if isinstance(tool, dict) else None
    return name if isinstance(name, str) else None


def _openai_tool_label(tool: Any) -> str | None:
    if isinstance(tool, dict):
        fn = tool.get("function")
        name = fn.get("name") if isinstance(fn, dict) else tool.get("name")
        if isinstance(name, str):
            return name
    return None


def _anthropic_tool_name(tool: Any, i: int) -> str:
    name = _anthropic_tool_label(tool)
    return f"tools[{i}]" if name is None else name


def _openai_tool_name(tool: Any, i: int) -> str:
    name = _openai_tool_label(tool)
    return f"tools[{i}]" if name is None else name


def _role(message: Any) -> str:
    role = message.get("role") if isinstance(message, dict) else None
    return role if isinstance(role, str) else "?"


def segments_anthropic(
    body: dict[str, Any],
    *,
    tools_first: bool = False,
    texts: dict[str, str] | None = None,
    known: Container[str] = (),
) -> list[Segment]:
    """Segments of an Anthropic Messages request: each ``system`` block (``system[i]``; a
    string system is one block ``system``), ``tools`` (all tools) and each ``tool``, then
    each ``message`` (``messages[i]:role``). ``tools_first`` puts the tools before the
    system blocks, the order Anthropic's own prompt cache uses; by default the system
    prompt leads, as in the prompt a self-hosted model renders from it. With ``texts``,
    also fills it with the redacted canonical JSON of each segment, by hash, except the
    hashes in ``known`` (texts already stored)."""
    texts_ = _sink(texts, known)
    exact = not _floats_differ(body)
    tools = _tool_segments(body.get("tools"), _anthropic_tool_name, texts_, exact)
    head: list[Segment] = []
    system = body.get("system")
    if isinstance(system, str):
        head.append(_segment("system", "system", canonical_json(system), texts_))
    elif isinstance(system, list):
        for i, block in enumerate(system):
            data = canonical_json(_strip(block), floats_checked=exact)
            head.append(_segment("system", f"system[{i}]", data, texts_))
    out = tools + head if tools_first else head + tools
    messages = body.get("messages")
    if isinstance(messages, list):
        for i, message in enumerate(messages):
            name = f"messages[{i}]:{_role(message)}"
            data = canonical_json(_strip(message), floats_checked=exact)
            out.append(_segment("message", name, data, texts_))
    return out


def segments_openai(
    body: dict[str, Any],
    *,
    tools_first: bool = True,
    texts: dict[str, str] | None = None,
    known: Container[str] = (),
) -> list[Segment]:
    """Segments of an OpenAI Chat Completions request as sent upstream: ``tools`` and each
    ``tool``, the leading system/developer messages (kind ``system``, ``messages[i]:role``),
    then every other message (kind ``message``). ``tools_first`` puts the tools before the
    leading system messages (how most chat templates render them), else after. ``texts``
    and ``known`` as in :func:`segments_anthropic`."""
    texts_ = _sink(texts, known)
    exact = not _floats_differ(body)
    tools = _tool_segments(body.get("tools"), _openai_tool_name, texts_, exact)
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    leading = 0
    while leading < len(messages) and _role(messages[leading]) in ("system", "developer"):
        leading += 1
    head, rest = [], []
    for i, message in enumerate(messages):
        kind = "system" if i < leading else "message"
        data = canonical_json(_strip(message), floats_checked=exact)
        seg = _segment(kind, f"messages[{i}]:{_role(message)}", data, texts_)
        (head if i < leading else rest).append(seg)
    return tools + head + rest if tools_first else head + tools + rest


# -- from the request bytes ------------------------------------------------------------
# The same segments, computed from the JSON bytes of a request instead of its decoded
# object. Each tool, system block and message is cut out of the bytes as it came
# (``msgspec.Raw``, no Python objects for its contents) and looked up by those bytes: an
# agent sends the same tools, system prompt and history every turn, so nearly every piece
# was seen the turn before and only the new ones are decoded, stripped and hashed (by the
# functions above, so the result is the same). Bodies of another shape (a ``tools`` that
# is not an array, say) go the object way.
class _Shape(msgspec.Struct):
    """What the segments are cut from, in one pass over the bytes."""

    tools: msgspec.Raw = msgspec.Raw(b"null")  # the whole list: looked up as one piece
    messages: list[msgspec.Raw] | None = None
    system: msgspec.Raw = msgspec.Raw(b"null")
    input: msgspec.Raw = msgspec.Raw(b"null")  # a Responses request (only pieces_of reads it)
    instructions: msgspec.Raw = msgspec.Raw(b"null")


_SHAPE = msgspec.json.Decoder(_Shape)
_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])
_decode_any = msgspec.json.Decoder().decode


class _Pieces(_BytesMemo):
    """(digest, chars, label) of a tool, block or message by its bytes as sent (the
    label: a tool's name or a message's role), or of the tool list by its tools' digests."""

    def __init__(self, budget: int = 8 * 1024 * 1024) -> None:
        super().__init__(budget)


_PIECES = _Pieces()


def _piece(tag: str, raw: bytes, label_of) -> tuple[str, int, str | None]:
    def make() -> tuple[str, int, str | None]:
        obj = _decode_any(raw)
        digest, chars = _DIGESTS.of(canonical_json(_strip(obj)))
        return digest, chars, label_of(obj)

    return _PIECES.get(tag, raw, make)


def _tools_of_list(data: bytes, api: str) -> list[Segment] | None:
    """The tool segments of a tools list's JSON (``None`` if it is not a list). An agent
    sends the same list every turn: it is looked up whole (one fingerprint and one compare
    for the dozen tools), and cut into tools only when not seen recently."""
    if data[:1] != b"[":
        return [] if data == b"null" else None
    try:
        segs = _PIECES.get(
            f"tool-list:{api}", data, lambda: tuple(_tools_from_raw(_ITEMS.decode(data), api))
        )
    except (msgspec.DecodeError, RecursionError):
        return None
    return list(segs)


def _tools_from_raw(raws: list[msgspec.Raw] | None, api: str) -> list[Segment]:
    if not raws:
        return []
    items = [bytes(t) for t in raws]
    label_of = _anthropic_tool_label if api == "anthropic" else _openai_tool_label
    pieces = [_piece(f"tool:{api}", t, label_of) for t in items]  # label: the name, or None

    def whole() -> tuple[str, int, str | None]:
        # The list's canonical JSON is its items' canonical JSON joined (compact separators).
        parts = [canonical_json(_strip(_decode_any(t))) for t in items]
        digest, chars = _DIGESTS.of(b"[" + b",".join(parts) + b"]")
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
) -> tuple[list[Segment], list[Piece]] | None:
    """:func:`cut_from_bytes` of a request whose parts the decode cut already
    (``MessagesBody.pieces``: the tools list's, the system's and each message's JSON
    bytes): the same result, without a pass over the body."""
    if tools_first is None:
        tools_first = api == "openai"
    tools, system, messages = pieces
    return _cut(api, tools, messages, system, tools_first, previous)


def pieces_of(raw: bytes, segs: list[Segment]) -> list[tuple[Segment, bytes]] | None:
    """The JSON bytes of each segment of ``segs`` (the segments of the request ``raw``,
    either API; the whole ``tools`` list left out), as they are in ``raw``; ``None`` when
    ``raw`` is not of the shape the segments were cut from."""
    try:
        shape = _SHAPE.decode(raw)
        tools_raw = bytes(shape.tools)
        tools = [bytes(t) for t in _ITEMS.decode(tools_raw)] if tools_raw[:1] == b"[" else []
        system = bytes(shape.system)
        blocks = [bytes(b) for b in _ITEMS.decode(system)] if system[:1] == b"[" else []
        given = bytes(shape.input)  # a Responses request's input (segments_responses.py)
        items = [bytes(i) for i in _ITEMS.decode(given)] if given[:1] == b"[" else []
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


def cut_of_chat(
    body: dict[str, Any], *, tools_first: bool = True, previous: ChatCut | None = None
) -> tuple[list[Segment], list[Piece], ChatCut]:
    """:func:`segments_of_chat` with each piece's bytes (as :func:`cut_from_bytes`, but
    ``None`` for the messages after the leading system ones), and what the next turn
    borrows from. ``previous``: the session's previous request as cut.
    The conversion lends a message it converted before as the very object
    (:class:`~prefixgate.convert.request.SessionTurns`): the same object at the same
    place is the same bytes, so its piece is taken as it was, without encoding it; any
    other is encoded alone and cut as if nothing came before."""
    tools = body.get("tools")
    messages = body["messages"]
    before = previous.messages if previous is not None else ()
    n, size = len(before), 0
    msgs: list[Any] = []
    for i, m in enumerate(messages):
        if i < n and before[i] is m:
            piece = previous.pieces[i]  # type: ignore[union-attr]
            msgs.append(piece)
            size += piece[0].chars
            continue
        data = _encode(m)
        got = _piece("message", data, _role)
        msgs.append((_seg("message", f"messages[{i}]:{got[2]}", got), data))
        size += len(data)
    if previous is not None and tools and tools is previous.tools:
        tools_part = previous.tools_part
    else:
        tools_part = _tools_part("openai", _encode(tools) if tools else b"null", [])
    assert tools_part is not None  # (a list of tools, or none)
    leading = _leading(msgs)
    for i in range(leading):  # a lent message that leads now: its bytes
        if msgs[i][1] is None:
            msgs[i] = (msgs[i][0], _encode(messages[i]))
    # the conversation's bytes are not kept: the change memory compares it by its hashes
    msgs[leading:] = [p if p[1] is None else (p[0], None) for p in msgs[leading:]]
    whole = _chat_order(tools_part, msgs, tools_first, leading)
    size += 64 * len(msgs) + sum(len(d or b"") for _, d in tools_part)
    return [p[0] for p in whole], _pieces(whole), ChatCut(messages, msgs, tools, tools_part, size)


_encode = msgspec.json.encode


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


def _tools_part(api: str, tools_list: bytes, prev_tools: list[Piece]) -> list[Piece] | None:
    """The ``tools`` segment and each tool's piece (``None``: not a list)."""
    tools = _tools_of_list(tools_list, api)
    if tools is None:
        return None
    if tools and prev_tools and _same_list(tools_list, prev_tools):
        tool_pieces = [(seg, p[1]) for seg, p in zip(tools[1:], prev_tools, strict=True)]
    elif tools:
        tool_pieces = [
            (seg, bytes(t)) for seg, t in zip(tools[1:], _ITEMS.decode(tools_list), strict=True)
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


def _cut(
    api: str,
    tools_list: bytes,
    messages_raw,
    system_raw,
    tools_first: bool,
    previous: list[Piece] | None,
) -> tuple[list[Segment], list[Piece]] | None:
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
    tools_part = _tools_part(api, tools_list, prev_tools)
    if tools_part is None:
        return None

    msgs: list[Piece] = []
    n = len(prev_messages)
    for i, m in enumerate(messages_raw or ()):
        if i < n:
            before = prev_messages[i]
            was = before[1]
            if m is was or (len(was) == len(m) and _equal(m, was)):
                msgs.append(before)
                continue
        data = bytes(m)
        piece = _piece("message", data, _role)
        msgs.append((_seg("message", f"messages[{i}]:{piece[2]}", piece), data))

    if api == "anthropic":
        head: list[Piece] = []
        system = bytes(system_raw)
        if system[:1] == b'"':
            head.append((_seg("system", "system", _piece("system", system, _no_label)), system))
        elif system[:1] == b"[":
            if (
                prev_blocks
                and prev_blocks[0][0].name != "system"
                and _same_list(system, prev_blocks)
            ):
                head = list(prev_blocks)
            else:
                for i, block in enumerate(_ITEMS.decode(system)):
                    data = bytes(block)
                    piece = _piece("block", data, _no_label)
                    head.append((_seg("system", f"system[{i}]", piece), data))
        elif system != b"null":
            return None
        whole = tools_part + head if tools_first else head + tools_part
        whole += msgs
    else:
        whole = _chat_order(tools_part, msgs, tools_first, _leading(msgs))
    return [p[0] for p in whole], _pieces(whole)


def _as(seg: Segment, kind: str) -> Segment:
    return seg if seg.kind == kind else Segment(kind, seg.name, seg.hash, seg.chars, seg.tokens)


def texts_of(
    body: dict[str, Any],
    *,
    api: str = "anthropic",
    tools_first: bool | None = None,
    known: Container[str] = (),
) -> dict[str, str]:
    """The redacted canonical JSON of each segment of ``body``, keyed by the hash of the
    original. ``api`` is ``"anthropic"`` or ``"openai"`` (``tools_first`` defaults as in
    its segments function); hashes in ``known`` (already stored) are left out."""
    texts: dict[str, str] = {}
    if tools_first is None:
        tools_first = api == "openai"
    if api == "anthropic":
        segments_anthropic(body, tools_first=tools_first, texts=texts, known=known)
    elif api == "openai":
        segments_openai(body, tools_first=tools_first, texts=texts, known=known)
    else:
        raise ValueError(f"unknown api {api!r}")
    return texts


class FirstChange(NamedTuple):
    index: int  # position in the current segment list
    offset: int  # estimated tokens before it: the prefix that could still be cached


def prefix_tokens(segments: Iterable[Segment]) -> int:
    """Estimated tokens of a run of segments; ``tool`` segments are parts of ``tools`` and
    are not counted twice."""
    return sum(seg.tokens for seg in segments if seg.kind != "tool")


def first_changed(prev: list[Segment], cur: list[Segment]) -> FirstChange | None:
    """Where ``cur`` first differs from ``prev``, position by position (a different kind,
    name or hash), or None when one list is a prefix of the other (a growing session)."""
    for i, (a, b) in enumerate(zip(prev, cur, strict=False)):
        if a.hash != b.hash or a.kind != b.kind or a.name != b.name:
            return FirstChange(i, prefix_tokens(cur[:i]))
    return None
