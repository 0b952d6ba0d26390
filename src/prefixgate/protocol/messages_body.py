"""The Anthropic Messages request as the hot path reads it: one typed decode.

A Claude Code request is mostly text (the system prompt, tool descriptions and schemas,
file contents in tool results) that the gateway moves but never reads. So the request is
decoded once into the structs below, where those texts stay ``msgspec.Raw`` (a view of
the JSON string in the request bytes, written back verbatim when the upstream request is
encoded): they are neither unescaped nor escaped again. Everything the gateway reads
(roles, block types, ids, names, tool inputs, sampling fields) is decoded and type-checked
by the same decode.

The typed decode is the fast path of the same contract that ``anthropic.check_messages_
request`` states on a plain dict. When it rejects a request (or any check after it
fails) the request takes the plain path: decoded as a dict, checked there, so the error
the client gets names the field exactly as before; and the plain path, when it accepts,
turns the dict into these structs (``typed_request``), so the converter has one input.

Depth: the structs bound the nesting of everything but the free-form values (tool
inputs, metadata, thinking, documents ...), whose depth is checked where they sit, so the
depth limit means the same on both paths for what the gateway decodes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta, Raw, Struct, field

from prefixgate.config import Limits
from prefixgate.errors import InvalidRequest
from prefixgate.protocol.anthropic import check_messages_request
from prefixgate.protocol.common import check_body_size, decode_body, json_depth
from prefixgate.protocol.placement import places_of, single, starts_of
from prefixgate.protocol.validate import MAX_TOKENS, check_text
from prefixgate.sequences import common_prefix

_QUOTE = 34  # '"': the first byte of a JSON string


def is_string(raw: Raw) -> bool:
    """Whether a raw JSON value is a string (the decoder gives values without blanks)."""
    return len(raw) > 0 and memoryview(raw)[0] == _QUOTE


# -- the structs (unknown fields are skipped: the converter never reads them) -------------
class Source(Struct):
    type: Literal["base64", "url"]
    media_type: Any = "image/png"
    data: Raw = Raw()
    url: Any = ""


class TextBlock(Struct, tag_field="type", tag="text"):
    text: Raw


class ImageBlock(Struct, tag_field="type", tag="image"):
    source: Source


class DocumentBlock(Struct, tag_field="type", tag="document"):
    source: Any = None
    title: Any = None


class ToolUseBlock(Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: Any = field(default_factory=dict)


class ToolResultBlock(Struct, tag_field="type", tag="tool_result"):
    tool_use_id: str
    # raw until the decode's walk: a string stays raw, an array becomes typed blocks
    content: Raw = Raw()
    is_error: Any = None


class ThinkingBlock(Struct, tag_field="type", tag="thinking"):
    thinking: Raw


class RedactedThinkingBlock(Struct, tag_field="type", tag="redacted_thinking"):
    pass


class ServerToolUseBlock(Struct, tag_field="type", tag="server_tool_use"):
    pass


class WebSearchResultBlock(Struct, tag_field="type", tag="web_search_tool_result"):
    pass


class SearchResultBlock(Struct, tag_field="type", tag="search_result"):
    pass


class ContainerUploadBlock(Struct, tag_field="type", tag="container_upload"):
    pass


Block = Union[  # noqa: UP007 (msgspec reads the union from this alias)
    TextBlock,
    ImageBlock,
    DocumentBlock,
    ToolUseBlock,
    ToolResultBlock,
    ThinkingBlock,
    RedactedThinkingBlock,
    ServerToolUseBlock,
    WebSearchResultBlock,
    SearchResultBlock,
    ContainerUploadBlock,
]


class Message(Struct):
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class SystemBlock(Struct):
    type: Literal["text"]
    text: Raw


class Tool(Struct):
    name: str
    description: Raw = Raw()
    input_schema: Raw = Raw()
    type: Any = None


class ToolChoice(Struct):
    type: Literal["auto", "any", "tool", "none"]
    name: Any = None
    disable_parallel_tool_use: Any = None


class Request(Struct):
    model: str
    max_tokens: int
    messages: list[Message]
    system: str | list[SystemBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    temperature: int | float | None = None
    top_p: int | float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: Any = None
    diagnostics: Any = None  # checked by diagnostics/request.py; never sent upstream


# The top-level fields the rest of the gateway reads from the body (relay, identity,
# records); the heavy ones (messages, system, tools) are read through ``.typed`` only.
_PLAIN_FIELDS = (
    "model",
    "max_tokens",
    "stream",
    "metadata",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "thinking",
)


class MessagesBody(dict):
    """A checked Messages request: a dict of its small top-level fields (what the
    gateway reads: ``model``, ``stream``, ``metadata`` ...), with the whole request typed
    in ``typed`` and its bytes in ``raw``."""

    __slots__ = ("typed", "raw", "pieces", "lent")

    def __init__(self, typed: Request, raw: bytes) -> None:
        super().__init__((k, v) for k in _PLAIN_FIELDS if (v := getattr(typed, k)) is not None)
        self.typed = typed
        self.raw = raw
        # the tools list's, the system's and each message's JSON bytes, when the decode
        # cut them (a session's previous request lent them): the capture's cut takes them
        self.pieces: tuple[bytes, bytes, list[bytes]] | None = None
        # the previous request's list of each message's bytes, and how many leading
        # messages of this one are its very objects (the capture then need not compare)
        self.lent: tuple[list[bytes], int] | None = None

    def whole(self) -> dict:
        """Every top-level field as it came (what an Anthropic upstream receives): the
        heavy and the unknown ones raw (they encode back verbatim), the rest decoded."""
        return {**_TOP.decode(self.raw), **self}

    def plain(self) -> dict:
        """The request decoded in full, as plain JSON objects."""
        return _ANY.decode(self.raw)


_TOP = msgspec.json.Decoder(dict[str, Raw])
_ANY = msgspec.json.Decoder()
_DECODERS: dict[tuple, msgspec.json.Decoder] = {}
_INNER = msgspec.json.Decoder(list[Block])
_LENIENT = msgspec.json.Decoder(Request)


def _decoder(limits: Limits) -> msgspec.json.Decoder:
    key = (limits.max_messages, limits.max_tools)
    dec = _DECODERS.get(key)
    if dec is None:
        tools = Annotated[list[Tool], Meta(max_length=limits.max_tools)] | None
        dec = _DECODERS[key] = msgspec.json.Decoder(
            _limited("LimitedRequest", limits, Message, [("tools", tools, None)])
        )
    return dec


def _limited(name: str, limits: Limits, message: type, more: list) -> type:
    """The request with its messages (of type ``message``) within the limits."""
    messages = Annotated[list[message], Meta(max_length=limits.max_messages)]  # type: ignore[valid-type]
    return msgspec.defstruct(name, [("messages", messages), *more], bases=(Request,))


class _Plain(Exception):
    """The typed path cannot vouch for this request: take the plain one."""


def decode_messages_body(
    raw: bytes, limits: Limits, lend: Lender | None = None, key_of=None
) -> MessagesBody:
    """Decode and check a Messages request (``InvalidRequest`` names what is wrong).

    ``lend``: the memory of each session's previous request (:class:`Decoded`), and
    ``key_of``: the session's key from the request's small fields (``None``: no session).
    A message, the tools or the system blocks whose bytes equal those at the same place
    in the session's previous request take the structs decoded from them then (one
    memcmp); only what is new is decoded, so an agent's turn decodes its tail. The result
    is the one the decode gives alone (the same structs, the same checks): the body's
    text is UTF-8 (its bytes lent were checked with the request that lent them)."""
    check_body_size(raw, limits)
    try:
        if lend is not None and key_of is not None:
            body = _lent_path(raw, limits, lend, key_of)
            if body is not None:
                return body  # (None: no session, and the whole body's text checked)
        else:
            check_text(raw)
        typed = _decoder(limits).decode(raw)
        _walk(typed, limits)
    except (msgspec.DecodeError, RecursionError, _Plain):
        return _plain_path(raw, limits)
    return MessagesBody(typed, raw)


# -- a session's previous request lends what is equal -------------------------------------
class Decoded:
    """One request's heavy parts as decoded: each part's own bytes (a copy, so that what is
    kept never holds a whole body alive) and the structs decoded from them (views of those
    bytes). ``messages``: per message (its bytes, its struct, its blocks)."""

    __slots__ = (
        "limits",
        "tools",
        "system",
        "messages",
        "parts",
        "size",
        "structs",
        "raws",
        "blocks",
        "raw",
        "starts",
        "rest",
        "top",
    )

    ENTRY = 256  # bytes an entry costs beyond its parts' bytes
    PART = 128  # bytes a message's or a block's structs cost beyond its bytes, about

    def __init__(
        self,
        limits: tuple,
        tools: tuple,
        system: tuple,
        messages: list,
        parts: list,
        size: int,
        columns: tuple[list, list, list[int]],
        kept: tuple[bytes, list[int], int] | None = None,
        top: Any = None,
    ) -> None:
        """``messages``: per message (its bytes, its struct, its blocks, its bytes as
        ``Raw``); ``parts``: each message's bytes; ``size``: what it all costs;
        ``columns``: the messages' structs, ``Raw``s and blocks so far (each message's
        own and those before it), as lists (a next request takes what it re-sends as
        slices of them); ``kept``: the request's body, where
        each message begins in it and where what follows its messages begins (with no
        second messages key in it), when known: the next request's leading messages are
        found in the same bytes at the same place, without decoding them; ``top``: then
        its top level without its messages (its tools and system as their own bytes), which
        a next request whose top level is the same bytes around its messages takes."""
        self.limits, self.tools, self.system = limits, tools, system
        self.messages, self.parts, self.size = messages, parts, size
        self.structs, self.raws, self.blocks = columns
        self.raw: bytes | None = kept[0] if kept is not None else None
        self.starts: list[int] = kept[1] if kept is not None else []
        self.rest: int = kept[2] if kept is not None else 0
        self.top = top

    def pieces(self) -> tuple[bytes, bytes, list[bytes]]:
        """The tools list's, the system's and each message's JSON bytes (the capture's cut)."""
        return self.tools[0], self.system[0], self.parts


class Lender:
    """Where :func:`decode_messages_body` finds a session's previous request
    (:class:`Decoded`) and keeps the latest (``convert.SessionTurns``, within its budget)."""

    def decoded(self, key: object) -> Decoded | None:
        raise NotImplementedError

    def keep_decoded(self, key: object, decoded: Decoded) -> None:
        raise NotImplementedError


_TOPS: dict[tuple, tuple[msgspec.json.Decoder, msgspec.json.Decoder, type]] = {}
_NULL = b"null"
_SYSTEM = msgspec.json.Decoder(str | list[SystemBlock] | None)
_MESSAGE = msgspec.json.Decoder(Message)
_RAWS = msgspec.json.Decoder(list[Raw])
_FIELDS = Request.__struct_fields__


def _tops(limits: Limits) -> tuple[msgspec.json.Decoder, msgspec.json.Decoder, type]:
    """The request's top level with its heavy parts raw, the tools list's decoder, and the
    type the whole decode gives (its limits)."""
    key = (limits.max_messages, limits.max_tools)
    got = _TOPS.get(key)
    if got is None:
        heavy = [("system", Raw, Raw(_NULL)), ("tools", Raw, Raw(_NULL))]
        top = _limited("RequestTop", limits, Raw, heavy)
        tools: msgspec.json.Decoder = msgspec.json.Decoder(
            Annotated[list[Tool], Meta(max_length=limits.max_tools)] | None
        )
        kind: type = _decoder(limits).type  # type: ignore[assignment]
        got = _TOPS[key] = (msgspec.json.Decoder(top), tools, kind)
    return got


def _previous(lend: Lender, key: object, lkey: tuple) -> Decoded | None:
    """The session's previous request as decoded, if decoded within the same limits."""
    prev = lend.decoded(key)
    return prev if prev is not None and prev.limits == lkey else None


def _same(raw: Raw, data: bytes) -> bool:
    """``raw``'s bytes are ``data`` (a length check, then one memcmp)."""
    return len(raw) == len(data) and raw == Raw(data)


def _by_place(raw: bytes, prev: Decoded, top_dec: msgspec.json.Decoder, limits: Limits):
    """The request decoded but for its leading messages that stand in the previous
    request's bytes at the same place: the bytes from the start up to message ``k`` the
    same as the previous request's (a memcmp, the longest such ``k`` found by halves),
    the document without messages ``0 … k - 1`` decoded, what it decoded found in the
    request at its place. ``(top, k, starts, rest, same)``: the top level with messages
    ``k …`` only, where every message begins, where what follows them begins, and whether
    the top level but for the messages is the previous request's (the same bytes before
    and after them: only the messages from ``k`` on are decoded then, the rest taken as
    it was); ``None``: nothing lent so."""
    starts, old = prev.starts, prev.raw
    if old is None or len(starts) < 2:
        return None
    view = memoryview(old)
    if not raw.startswith(view[: starts[1]]):
        return None
    # raw shares old's bytes up to message lo, not hi (if hi > lo); each comparison is of
    # the bytes past lo only, so the search reads each byte about twice at most, not once
    # a halving (an edit deep in a long conversation: a moved marker)
    lo, hi = 1, len(starts) - 1
    if raw.startswith(view[starts[1] : starts[hi]], starts[1]):
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if raw.startswith(view[starts[lo] : starts[mid]], starts[lo]):
            lo = mid
        else:
            hi = mid
    k = lo
    places = starts[:k]
    tail = len(old) - prev.rest  # the bytes after the previous request's messages
    if prev.top is not None and len(raw) - tail > starts[k] and raw.endswith(view[prev.rest :]):
        # Before its messages and after them, the request is the previous one's, byte for
        # byte (an agent's turn: the tools, the system prompt and the settings as they
        # were): the messages from k on are decoded as an array of their own, their text
        # checked first, and found in place up to where those bytes begin.
        end = len(raw) - tail
        doc = b"[" + raw[starts[k] : end]
        if not doc.isascii():
            _check_text_of(doc, raw)
        try:
            msgs = _RAWS.decode(doc)
        except msgspec.DecodeError:  # not an array there: the messages are looked for below
            msgs = None
        if msgs is not None:
            if k + len(msgs) > limits.max_messages:
                raise _Plain  # the plain check says what is wrong
            if places_of(raw, starts[k], msgs, places) == end:
                return msgspec.structs.replace(prev.top, messages=msgs), k, places, end, True
            places = starts[:k]
    # The request without its first k messages: their bytes and the comma after the last
    # of them are the previous request's, as checked (its text too); what follows is
    # decoded as it is, its text checked first.
    doc = raw[: starts[0]] + raw[starts[k] :]
    if not doc.isascii():
        _check_text_of(doc, raw)
    top = top_dec.decode(doc)
    if k + len(top.messages) > limits.max_messages:
        raise _Plain  # the plain check says what is wrong
    end = places_of(raw, starts[k], top.messages, places)
    if end < 0:
        return None
    # The messages decoded are those of the array in place, unless a second messages key
    # follows it: what follows is looked through unless it is the previous request's
    # (its bytes the same: looked through then)
    same_rest = len(raw) - end == tail and raw.endswith(view[prev.rest :])
    if not same_rest and not single(raw, end):
        return None
    return top, k, places, end, False


def _check_text_of(part: bytes, raw: bytes) -> None:
    """``part`` of ``raw`` (its bytes, whole or two slices meeting at a JSON delimiter)
    is UTF-8; else the error :func:`check_text` gives for ``raw``, which names the byte
    where it is in the body."""
    try:
        part.decode()
    except UnicodeDecodeError:
        check_text(raw)
        raise InvalidRequest("request body is not valid UTF-8") from None


def _lent_path(raw: bytes, limits: Limits, lend: Lender, key_of) -> MessagesBody | None:
    """The typed decode with what the session's previous request lends (``None``: no
    session; the caller decodes alone). Raises as the decode does.

    A session told by the request's headers is known before the decode: its previous
    request's leading messages standing at the same place in the same bytes are then not
    decoded at all (:func:`_by_place`), nor is their text checked again. Otherwise the
    whole top level is decoded and each message compared with the one at the same index
    (a memcmp). ``None`` only once the whole body's text was checked."""
    top_dec, tools_dec, kind = _tops(limits)
    room = limits.max_json_depth
    lkey = (room, limits.max_messages, limits.max_tools)
    early = key_of({})  # the session's key from the headers alone, when they tell it
    prev = _previous(lend, early, lkey) if early is not None else None
    placed = _by_place(raw, prev, top_dec, limits) if prev is not None else None
    starts: tuple[list[int], int] | None = None
    same_top = False
    if placed is not None:
        top, k, places, rest, same_top = placed
        starts = places, rest
    else:
        check_text(raw)
        top, k = top_dec.decode(raw), 0
    small = {f: v for f in _PLAIN_FIELDS if (v := getattr(top, f)) is not None}
    key = key_of(small)
    if key != early:  # told by the body: its previous request is looked up now
        if prev is not None:
            lend.keep_decoded(early, prev)  # (the headers' key lent nothing after all)
        if key is None:
            return None
        if placed is not None:  # what another request lent is not this session's
            check_text(raw)
            top, k, starts, same_top = top_dec.decode(raw), 0, None, False
        prev = _previous(lend, key, lkey)
    elif key is None:
        return None
    if prev is not None and (same_top or _same(top.tools, prev.tools[0])):
        tools = prev.tools
    else:
        data = bytes(top.tools)
        tools = (data, tools_dec.decode(data))
    if prev is not None and (same_top or _same(top.system, prev.system[0])):
        system = prev.system
    else:
        data = bytes(top.system)
        system = (data, _SYSTEM.decode(data))
    before = prev.messages if prev is not None else ()
    n = len(before)
    tops = top.messages
    if k:  # by place: tops are messages k … and the walk starts at the first of them
        skip = 0
    else:
        # The leading messages whose bytes equal the previous request's (compared in C,
        # a memcmp each) are taken at once; the walk starts after them.
        k = skip = common_prefix(tops, prev.raws) if prev is not None and n else 0
    if k:
        assert prev is not None
        messages = prev.messages[:k]
        parts, structs, raws = prev.parts[:k], prev.structs[:k], prev.raws[:k]
        blocks = prev.blocks[k - 1]
        counts = prev.blocks[:k]
    else:
        messages, parts, structs, raws, counts = [], [], [], [], []
        blocks = 0
    shift = k - skip  # a message's index in the request, beyond its index in tops
    same = k  # how many leading messages are the previous request's very objects
    for j in range(skip, len(tops)):
        m = tops[j]
        i = j + shift
        if i < n:
            was = before[i]
            if len(m) == len(was[0]) and m == was[3]:  # one memcmp
                messages.append(was)
                parts.append(was[0])
                if same == i:
                    same += 1
                structs.append(was[1])
                raws.append(was[3])
                blocks += was[2]
                counts.append(blocks)
                continue
        data = bytes(m)
        struct = _MESSAGE.decode(data)
        count = _message_blocks(struct, room)
        as_raw = Raw(data)
        messages.append((data, struct, count, as_raw))
        parts.append(data)
        structs.append(struct)
        raws.append(as_raw)
        blocks += count
        counts.append(blocks)
    fields = {f: getattr(top, f) for f in _FIELDS}
    fields["tools"], fields["system"], fields["messages"] = tools[1], system[1], structs
    typed = kind(**fields)
    # the tools lent are the previous request's very structs, checked when it was decoded
    # (under the same limits: ``lkey``): not walked again
    _walk_top(typed, limits, blocks, tools_checked=prev is not None and tools is prev.tools)
    # the parts are disjoint pieces of the body: their bytes are at most its size
    size = Decoded.ENTRY + len(raw) + Decoded.PART * (len(messages) + blocks)
    if early is not None and key == early and starts is None:
        starts = starts_of(raw, tops)  # (a whole decode: where this request's messages begin)
    kept = (raw, *starts) if starts is not None else None
    top_kept = None
    if kept is not None:
        size += len(raw)  # the body kept, for the next request to be compared with
        # its top level for the next request to take (no view of this body's bytes)
        top_kept = msgspec.structs.replace(
            top, messages=[], tools=Raw(tools[0]), system=Raw(system[0])
        )
    decoded = Decoded(
        lkey, tools, system, messages, parts, size, (structs, raws, counts), kept, top_kept
    )
    lend.keep_decoded(key, decoded)
    body = MessagesBody(typed, raw)
    body.pieces = decoded.pieces()
    if prev is not None:
        body.lent = prev.parts, same
    return body


def _plain_path(raw: bytes, limits: Limits) -> MessagesBody:
    body = decode_body(raw, limits)
    check_messages_request(body, limits)
    # Accepted there: the same request typed (what the typed path could not vouch for
    # was a limit, which the plain check has now applied).
    return MessagesBody(_typed(raw), raw)


def typed_request(body: dict) -> Request:
    """A plain Messages request dict as the typed structs (the converter's input)."""
    return _typed(msgspec.json.encode(body))


def _typed(raw: bytes) -> Request:
    """The typed structs of a request, without the limits (``InvalidRequest`` if it does
    not have the shape the converter reads)."""
    try:
        typed = _LENIENT.decode(raw)
        _walk(typed, None)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(
            f"request body does not have the shape of a Messages request: {exc}"
        ) from None
    except _Plain:
        raise InvalidRequest("request body does not have the shape of a Messages request") from None
    except RecursionError:
        raise InvalidRequest("request JSON is nested too deeply") from None
    return typed


def _walk(typed: Request, limits: Limits | None) -> None:
    """What the structs cannot say: raw texts are strings, counts and depths are within
    the limits, and tool results' contents are typed. ``_Plain`` if anything is off."""
    room = limits.max_json_depth if limits is not None else None
    blocks = 0
    for m in typed.messages:
        blocks += _message_blocks(m, room)
    _walk_top(typed, limits, blocks)


def _message_blocks(m: Message, room: int | None) -> int:
    """One message's blocks checked (``_Plain`` if one is off), and how many it has."""
    content = m.content
    if type(content) is list:
        for b in content:
            _check_block(b, room, 5)
        return len(content)
    return 0


def _walk_top(
    typed: Request, limits: Limits | None, blocks: int, *, tools_checked: bool = False
) -> None:
    """:func:`_walk` but for the messages, whose blocks (``blocks`` of them) are checked.
    ``tools_checked``: the tools are structs a decode under the same limits checked."""
    if limits is not None and (not typed.model or not 1 <= typed.max_tokens <= MAX_TOKENS):
        raise _Plain
    room = limits.max_json_depth if limits is not None else None
    system = typed.system
    if type(system) is list:
        blocks += len(system)
        for s in system:
            if not is_string(s.text):
                raise _Plain
    if limits is None:
        return
    if blocks > limits.max_blocks:
        raise _Plain
    tools = () if tools_checked or not typed.tools else typed.tools
    for t in tools:
        schema = t.input_schema
        if schema and not (memoryview(schema)[0] == 123 or bytes(schema) == b"null"):  # '{'
            raise _Plain
    if typed.tool_choice is not None:
        tc = typed.tool_choice
        if tc.type == "tool" and not isinstance(tc.name, str):
            raise _Plain
        _deep(tc.name, room, 3)
        _deep(tc.disable_parallel_tool_use, room, 3)
    _deep(typed.metadata, room, 2)
    _deep(typed.thinking, room, 2)
    _deep(typed.output_config, room, 2)
    for t in tools:
        _deep(t.type, room, 4)


def _check_block(b: Block, room: int | None, at: int) -> None:
    """Check one block, which sits at depth ``at``."""
    kind = type(b)
    if kind is TextBlock:
        if not is_string(b.text):
            raise _Plain
    elif kind is ThinkingBlock:
        if not is_string(b.thinking):
            raise _Plain
    elif kind is ToolUseBlock:
        _deep(b.input, room, at + 1)
    elif kind is ToolResultBlock:
        content = b.content
        if type(content) is Raw:
            if len(content) == 0 or bytes(memoryview(content)[:4]) == b"null":
                b.content = None
            elif memoryview(content)[0] == 91:  # '[': typed blocks
                try:
                    b.content = content = _INNER.decode(content)
                except (msgspec.DecodeError, RecursionError):
                    raise _Plain from None
            elif not is_string(content):
                raise _Plain
        if type(content) is list:
            for inner in content:
                _check_block(inner, room, at + 2)
        _deep(b.is_error, room, at + 1)
    elif kind is DocumentBlock:
        if b.source and type(b.source) is not dict:  # (no source reads as an empty one)
            raise _Plain
        _deep(b.source, room, at + 1)
        _deep(b.title, room, at + 1)
    elif kind is ImageBlock:
        _deep(b.source.media_type, room, at + 2)
        _deep(b.source.url, room, at + 2)


def _deep(value: object, room: int | None, at: int) -> None:
    """``value`` sits at depth ``at`` (the body is depth 1): past the limit, ``_Plain``."""
    if room is not None and type(value) in (dict, list) and at - 1 + json_depth(value, room) > room:
        raise _Plain
