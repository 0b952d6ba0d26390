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

from prefixgate.record.record import Segment
from prefixgate.record.redact import redact

_encode_sorted = msgspec.json.Encoder(order="sorted").encode
_encode_float = msgspec.json.encode
# msgspec's sorted compact JSON equals json.dumps(sort_keys, ensure_ascii=False, compact)
# for everything but some floats: exponent forms (msgspec "1e16", "1e-7" where Python
# writes "1e+16", "1e-07") and non-finite ones (msgspec "null", Python "NaN"). An object
# holding such a float is encoded with json.dumps instead. Finding them is a walk over the
# object's containers (most agent requests hold no float at all), not a scan of its text.
_FLOAT_OR_CONTAINER = frozenset((dict, list, float))


def floats_differ(obj: Any) -> bool:
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
    if data is None or (not floats_checked and floats_differ(obj)):
        text = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        data = text.encode("utf-8", "surrogatepass")
    return data


class _Float(Exception):
    """The JSON being decoded holds a float (:func:`canonical_of`'s first decode)."""


def _no_float(_text: str) -> float:
    raise _Float


_decode_any = msgspec.json.Decoder().decode
_decode_no_float = msgspec.json.Decoder(float_hook=_no_float).decode


def canonical_of(data: bytes) -> tuple[Any, bytes]:
    """A piece's JSON bytes decoded, and the canonical JSON of it without its
    ``cache_control`` keys: ``canonical_json(stripped(obj))``, without the walk for floats
    when the decode met none (a float stops it, and it is decoded again the usual way)."""
    try:
        obj = _decode_no_float(data)
        checked = True
    except _Float:
        obj = _decode_any(data)
        checked = False
    return obj, canonical_json(stripped(obj), floats_checked=checked)


def _chars(data: bytes) -> int:
    return len(data) if data.isascii() else len(data.decode("utf-8", "surrogatepass"))


class TextSink:
    """Where captured texts go: ``out`` (hash -> redacted text), skipping ``known``."""

    __slots__ = ("out", "known")

    def __init__(self, out: dict[str, str], known: Container[str]) -> None:
        self.out = out
        self.known = known


def text_sink(texts: dict[str, str] | None, known: Container[str]) -> TextSink | None:
    return None if texts is None else TextSink(texts, known)


class BytesMemo:
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


class _Digests(BytesMemo):
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


DIGESTS = _Digests()


def segment(kind: str, name: str, data: bytes, texts: TextSink | None) -> Segment:
    digest, chars = DIGESTS.of(data)
    if texts is not None and digest not in texts.out and digest not in texts.known:
        texts.out[digest] = redact(data.decode("utf-8", "surrogatepass"))
    return Segment(kind, name, digest, chars, (chars + 3) // 4)


def stripped(obj: Any) -> Any:
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
    out = [stripped(item) for item in items]
    if any(a is not b for a, b in zip(out, items, strict=True)):
        return out
    return items


def tool_segments(tools: Any, name_of: Any, texts: TextSink | None, exact: bool) -> list[Segment]:
    if not isinstance(tools, list) or not tools:
        return []
    parts = [canonical_json(stripped(tool), floats_checked=exact) for tool in tools]
    # The list's canonical JSON is its items' canonical JSON joined (compact separators).
    out = [segment("tools", "tools", b"[" + b",".join(parts) + b"]", texts)]
    for i, (tool, data) in enumerate(zip(tools, parts, strict=True)):
        out.append(segment("tool", name_of(tool, i), data, texts))
    return out


def anthropic_tool_label(tool: Any) -> str | None:
    name = tool.get("name") if isinstance(tool, dict) else None
    return name if isinstance(name, str) else None


def openai_tool_label(tool: Any) -> str | None:
    if isinstance(tool, dict):
        fn = tool.get("function")
        name = fn.get("name") if isinstance(fn, dict) else tool.get("name")
        if isinstance(name, str):
            return name
    return None


def _anthropic_tool_name(tool: Any, i: int) -> str:
    name = anthropic_tool_label(tool)
    return f"tools[{i}]" if name is None else name


def openai_tool_name(tool: Any, i: int) -> str:
    name = openai_tool_label(tool)
    return f"tools[{i}]" if name is None else name


def role_of(message: Any) -> str:
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
    texts_ = text_sink(texts, known)
    exact = not floats_differ(body)
    tools = tool_segments(body.get("tools"), _anthropic_tool_name, texts_, exact)
    head: list[Segment] = []
    system = body.get("system")
    if isinstance(system, str):
        head.append(segment("system", "system", canonical_json(system), texts_))
    elif isinstance(system, list):
        for i, block in enumerate(system):
            data = canonical_json(stripped(block), floats_checked=exact)
            head.append(segment("system", f"system[{i}]", data, texts_))
    out = tools + head if tools_first else head + tools
    messages = body.get("messages")
    if isinstance(messages, list):
        for i, message in enumerate(messages):
            name = f"messages[{i}]:{role_of(message)}"
            data = canonical_json(stripped(message), floats_checked=exact)
            out.append(segment("message", name, data, texts_))
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
    texts_ = text_sink(texts, known)
    exact = not floats_differ(body)
    tools = tool_segments(body.get("tools"), openai_tool_name, texts_, exact)
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    leading = 0
    while leading < len(messages) and role_of(messages[leading]) in ("system", "developer"):
        leading += 1
    head, rest = [], []
    for i, message in enumerate(messages):
        kind = "system" if i < leading else "message"
        data = canonical_json(stripped(message), floats_checked=exact)
        seg = segment(kind, f"messages[{i}]:{role_of(message)}", data, texts_)
        (head if i < leading else rest).append(seg)
    return tools + head + rest if tools_first else head + tools + rest


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
