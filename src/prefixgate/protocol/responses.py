"""OpenAI Responses API (``POST /v1/responses``): the request as the hot path reads it, and
its checks. Errors are answered in OpenAI's envelope (``protocol/openai.py``).

What Codex CLI sends is mostly text (its instructions as developer messages, tool
descriptions and schemas, command output in tool results) that the gateway moves but never
reads. The request is decoded once into the structs below, where those texts stay
``msgspec.Raw`` (the JSON string as the client wrote it, written back verbatim when the
upstream request is encoded), as ``protocol/messages_body.py`` does for Anthropic.

Every item is one struct (``Item``) whose ``type`` says which of its fields matter: a
message item may come without a ``type`` (the SDK's short form ``{"role", "content"}``),
which a tagged union cannot read. :func:`_check_item` then says, per type, what is missing
or wrong, naming the field (``input[3].call_id``), and refuses what a stateless gateway in
front of a Chat Completions server cannot serve: item references and a previous response
(there is no stored response), an unknown item type, a tool output without its call, a
file by id. Nothing is sent upstream for a refused request.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from msgspec import Raw, Struct

from prefixgate.apis.responses.compaction import unseal
from prefixgate.config import Limits
from prefixgate.errors import InvalidRequest
from prefixgate.protocol.common import check_body_bytes, json_depth, too_deep
from prefixgate.protocol.messages_body import Lender, is_string
from prefixgate.protocol.validate import MAX_TOKENS, check_count, not_json
from prefixgate.sequences import common_prefix


class Part(Struct):
    """One content part: ``input_text``, ``output_text``, ``refusal``, ``input_image``,
    ``input_file``, ``summary_text``, ``reasoning_text``."""

    type: str
    text: Raw = Raw()
    refusal: Raw = Raw()
    image_url: Any = None
    file_id: Any = None
    detail: Any = None
    file_data: Any = None
    filename: Any = None
    file_url: Any = None


class Item(Struct):
    """One input item; which fields count depends on ``type``."""

    type: str = "message"
    role: str | None = None
    content: str | list[Part] | None = None  # message; reasoning's raw text parts
    call_id: str | None = None  # function_call(_output), custom_tool_call(_output)
    name: str | None = None
    namespace: str | None = None
    arguments: Raw = Raw()  # function_call: a JSON string, sent on as it came
    input: Raw = Raw()  # custom_tool_call: the tool's text input
    output: Raw = Raw()  # a string, or (after the check) a list of parts
    summary: list[Part] | None = None  # reasoning
    id: Any = None
    status: Any = None
    encrypted_content: Any = None


class Tool(Struct):
    """A tool: ``function``, ``custom`` (free-form text input), ``namespace`` (a group of
    functions), or a hosted tool (web search …) that a self-hosted upstream cannot run."""

    type: str
    name: str | None = None
    description: Raw = Raw()
    parameters: Raw = Raw()
    strict: Any = None
    format: Any = None
    tools: list[Tool] | None = None  # namespace


class Request(Struct):
    model: str
    input: str | list[Item]
    instructions: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: int | float | None = None
    top_p: int | float | None = None
    stream: bool | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    prompt: Any = None
    prompt_cache_key: str | None = None
    prompt_cache_options: Any = None  # checked by diagnostics/request.py
    service_tier: Any = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    client_metadata: Any = None  # Codex's: what the request is for (record/compacted.py)


# What the rest of the gateway reads as a dict (relay, identity, records).
_PLAIN_FIELDS = ("model", "stream", "user", "prompt_cache_key", "metadata", "max_output_tokens")

# Hosted tools: dropped on the way to a Chat upstream, as Anthropic's server tools are.
HOSTED_TOOLS = frozenset(
    (
        "web_search",
        "web_search_preview",
        "web_search_2025_08_26",
        "web_search_preview_2025_03_11",
        "file_search",
        "computer_use_preview",
        "computer",
        "code_interpreter",
        "image_generation",
        "mcp",
        "local_shell",
        "shell",
        "apply_patch",
    )
)
_ROLES = ("user", "assistant", "system", "developer")
_TEXT_IN = frozenset(("input_text", "input_image", "input_file"))
_TEXT_SYSTEM = frozenset(("input_text",))
_TEXT_OUT = frozenset(("output_text", "refusal", "input_text"))
TRIGGER = "compaction_trigger"
_UNSTORED = {
    "item_reference": "this gateway keeps no items; send the item itself",
}


class ResponsesBody(dict):
    """A checked Responses request: a dict of its small top-level fields, the whole
    request typed in ``typed``, its bytes in ``raw``, whether it holds an image, and
    whether it asks for a compaction (its last item a ``compaction_trigger``)."""

    __slots__ = ("typed", "raw", "images", "compacting")

    def __init__(self, typed: Request, raw: bytes, images: bool) -> None:
        super().__init__((k, v) for k in _PLAIN_FIELDS if (v := getattr(typed, k)) is not None)
        self.typed = typed
        self.raw = raw
        self.images = images
        items = typed.input
        self.compacting = type(items) is list and items[-1].type == TRIGGER

    def whole(self) -> dict:
        """Every top-level field as it came (what a Responses upstream receives): the
        heavy and unknown ones raw (they encode back verbatim)."""
        return _TOP.decode(self.raw)

    def plain(self) -> dict:
        """The request decoded in full, as plain JSON objects."""
        return _ANY.decode(self.raw)


_TOP = msgspec.json.Decoder(dict[str, Raw])
_ANY = msgspec.json.Decoder()
_DECODER = msgspec.json.Decoder(Request)
_PARTS = msgspec.json.Decoder(list[Part])
_AT = re.compile(r"(?: - at )?`\$\.?([^`]*)`")


_CALLS = frozenset(("function_call", "custom_tool_call"))


class Checked:
    """A session's latest request as checked, for its next one to go on from: each input
    item's bytes and its checked struct, what the walk had counted after each item (the
    parts; the index of the first item with an image; each call seen, with its index),
    and the tools' bytes. Kept by a :class:`~prefixgate.protocol.messages_body.Lender`
    (``SessionTurns``), within its budget (``size``)."""

    __slots__ = (
        "limits", "raws", "items", "parts", "images", "calls", "call_map", "tools",
        "typed_tools", "size",
    )  # fmt: skip

    ENTRY = 512  # bytes an entry costs beyond its items' bytes
    ITEM = 160  # and each item: its bytes' object, the list slots, its count

    def __init__(self, limits, raws, items, parts, images, calls, tools) -> None:
        self.limits = limits
        self.raws: list[Raw] = raws  # each its own bytes (no view of a request's body)
        self.items: list[Item] = items
        self.parts: list[int] = parts  # parts counted after item i
        self.images: int = images  # the first item holding an image (len(items): none)
        self.calls: list[tuple[int, str, str]] = calls  # (index, call_id, kind)
        self.call_map: dict[str, str] = {}  # call_id -> kind after the last item
        self.tools: bytes = tools
        self.typed_tools: list[Tool] | None = None  # the tools as checked
        self.size = self.ENTRY + len(tools) + sum(map(len, raws)) + self.ITEM * len(raws)


def decode_responses_body(
    raw: bytes, limits: Limits, lend: Lender | None = None, key_of=None
) -> ResponsesBody:
    """Decode and check a Responses request (``InvalidRequest`` names what is wrong).

    ``lend`` and ``key_of`` (the session's key from the request's small fields, or None):
    the session's latest request as checked (:class:`Checked`) lends its leading input
    items whose bytes are the same, the very structs checked then, and its tools when
    theirs are: those are not checked again, the walk goes on from what it had counted.
    The top level is read with the items and the tools as bytes, and only the new items
    are decoded (each from its own copy: what is kept holds no request's body). What a
    decode alone would refuse goes its way, so what is refused, and how, is what the
    decode and the check alone say."""
    check_body_bytes(raw, limits)
    if lend is not None and key_of is not None:
        got = _lent(raw, limits, lend, key_of)
        if got is not None:
            return got
    try:
        typed = _DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        raise _shape_error(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise not_json(raw, exc) from None
    except RecursionError:
        raise too_deep(limits) from None
    return ResponsesBody(typed, raw, check_request(typed, limits))


def _top_type() -> type:
    """:class:`Request` with its input items and its tools as their bytes."""
    fields: list = []
    for f in msgspec.structs.fields(Request):
        kind = {"input": str | list[Raw], "tools": Raw}.get(f.name, f.type)
        default = Raw(b"null") if f.name == "tools" else f.default
        fields.append((f.name, kind) if default is msgspec.NODEFAULT else (f.name, kind, default))
    return msgspec.defstruct("RequestTop", fields)


_TOP_LENT: msgspec.json.Decoder[Any] = msgspec.json.Decoder(_top_type())
_ITEM = msgspec.json.Decoder(Item)
_TOOLS = msgspec.json.Decoder(list[Tool] | None)
_NAMES = Request.__struct_fields__


def _lent(raw: bytes, limits: Limits, lend: Lender, key_of) -> ResponsesBody | None:
    """The decode and check lent by the session's previous request; None: there is no
    session, the input is a string, or something is off (the decode alone then says
    what, as it says it)."""
    try:
        top = _TOP_LENT.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    raws = top.input
    if type(raws) is not list:
        return None
    key = key_of({f: v for f in _PLAIN_FIELDS if (v := getattr(top, f)) is not None})
    if key is None:
        return None
    tools = bytes(top.tools)
    lkey = (limits.max_blocks, limits.max_json_depth, limits.max_messages, limits.max_tools)
    got = lend.decoded(key)
    prev = got if isinstance(got, Checked) and got.limits == lkey else None
    k = 0
    if prev is not None:
        k = common_prefix(raws, prev.raws)
        if k and prev.items[k - 1].type == TRIGGER:  # the last item only: not so here
            k -= 1
    tools_checked = prev is not None and tools == prev.tools
    new = list(map(bytes, raws[k:]))  # each its own copy: kept, no view of the body
    try:
        items: list[Item] = prev.items[:k] if prev is not None else []
        items += map(_ITEM.decode, new)
        typed_tools = (
            prev.typed_tools if prev is not None and tools_checked else _TOOLS.decode(tools)
        )
    except (msgspec.DecodeError, RecursionError):
        return None
    fields = {name: getattr(top, name) for name in _NAMES}
    fields["input"], fields["tools"] = items, typed_tools
    typed = Request(**fields)
    state = _Walk(limits)
    state.last = f"input[{len(items) - 1}]"
    if k:
        assert prev is not None
        state.parts = prev.parts[k - 1]
        state.images = prev.images < k
        if k == len(prev.items):  # (its lists and map given up: taken as they are)
            calls, parts, state.calls = prev.calls, prev.parts, prev.call_map
        else:
            calls = [c for c in prev.calls if c[0] < k]
            parts = prev.parts[:k]
            state.calls = {cid: kind for _, cid, kind in calls}
        images = prev.images if prev.images < k else len(items)
    else:
        calls, parts, images = [], [], len(items)
    check_request(typed, limits, state, k, tools_checked)
    for i in range(k, len(items)):  # what the walk counted after each new item
        item = items[i]
        if item.type in _CALLS:
            calls.append((i, item.call_id, item.type))
    parts += state.counted
    if images == len(items) and state.images:
        images = state.first_image
    kept: list[Raw] = prev.raws[:k] if prev is not None else []
    kept += map(Raw, new)
    checked = Checked(lkey, kept, items, parts, images, calls, tools)
    checked.typed_tools, checked.call_map = typed.tools, state.calls
    lend.keep_decoded(key, checked)
    return ResponsesBody(typed, raw, state.images)


def _shape_error(text: str) -> InvalidRequest:
    """msgspec's ``Expected `str`, got `int` - at `$.input[0].role``` as ``input[0].role:
    Expected `str`, got `int```, with the field as ``param``."""
    m = _AT.search(text)
    if m is None:
        if text.startswith("Expected `object`"):
            return InvalidRequest("request body must be a JSON object")
        return InvalidRequest(f"request body: {text}")
    where = m.group(1)
    what = text[: m.start()].rstrip(" -")
    if not where:
        return InvalidRequest(f"request body: {what}")
    return InvalidRequest(f"{where}: {what}", param=where)


def check_request(
    req: Request,
    limits: Limits,
    state: _Walk | None = None,
    start: int = 0,
    tools_checked: bool = False,
) -> bool:
    """What the structs cannot say; returns whether the request holds an image.
    ``state``, ``start``: the input's first ``start`` items were checked (as the very
    structs of a session's previous request), the walk's counts after them in ``state``,
    which then counts the parts after each further item (``counted``); ``tools_checked``:
    the tools were, under the same limits."""
    if not req.model:
        raise InvalidRequest("model: a non-empty string is required", param="model")
    for name, why in (
        ("previous_response_id", "this gateway stores no responses"),
        ("conversation", "this gateway stores no conversations"),
        ("prompt", "prompt templates are not supported"),
    ):
        if getattr(req, name) is not None:
            raise InvalidRequest(
                f"{name}: {why}; send the whole conversation in input (store: false)",
                param=name,
            )
    if req.background:
        raise InvalidRequest(
            "background: background responses need stored state, which this gateway keeps none of",
            param="background",
        )
    mot = req.max_output_tokens
    if mot is not None and not 1 <= mot <= MAX_TOKENS:
        check_count({"max_output_tokens": mot}, "max_output_tokens")
    room = limits.max_json_depth
    for name in ("tool_choice", "reasoning", "text", "metadata"):
        _deep(getattr(req, name), room, 2, name)
    _check_tool_choice(req.tool_choice)
    if not tools_checked:
        _check_tools(req.tools, limits)
    items = req.input
    if type(items) is str:
        return False
    if not items:
        raise InvalidRequest("input: at least one item is required", param="input")
    if len(items) > limits.max_messages:
        raise InvalidRequest(
            f"input: at most {limits.max_messages} items are accepted", param="input"
        )
    if state is None:
        state = _Walk(limits)
        state.last = f"input[{len(items) - 1}]"
        for i, item in enumerate(items):
            _check_item(item, f"input[{i}]", state)
        return state.images
    counted = state.counted
    for i in range(start, len(items)):
        _check_item(items[i], f"input[{i}]", state)
        counted.append(state.parts)
        if state.images and state.first_image < 0:
            state.first_image = i
    return state.images


class _Walk:
    __slots__ = ("limits", "parts", "calls", "images", "last", "counted", "first_image")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.last = ""  # where the last item is
        self.parts = 0
        self.calls: dict[str, str] = {}  # call id -> the kind of its call, seen so far
        self.images = False
        # (the lent check's) the parts counted after each item walked, and the first
        # item walked that holds an image
        self.counted: list[int] = []
        self.first_image = -1

    def count(self, n: int, where: str) -> None:
        self.parts += n
        if self.parts > self.limits.max_blocks:
            raise InvalidRequest(
                f"{where}: at most {self.limits.max_blocks} content parts are accepted",
                param=where,
            )


def _need(value: object, kind: type, where: str, what: str) -> None:
    if not isinstance(value, kind):
        raise InvalidRequest(f"{where}: {what} is required", param=where)


def _need_text(raw: Raw, where: str) -> None:
    if not is_string(raw):
        raise InvalidRequest(f"{where}: a string is required", param=where)


def _check_item(item: Item, where: str, state: _Walk) -> None:
    kind = item.type
    if kind == "message":
        if item.role not in _ROLES:
            raise InvalidRequest(
                f"{where}.role: must be one of {', '.join(_ROLES)}", param=f"{where}.role"
            )
        content = item.content
        if content is None:
            raise InvalidRequest(
                f"{where}.content: a string or an array of parts is required",
                param=f"{where}.content",
            )
        if type(content) is list:
            allowed = (
                _TEXT_OUT
                if item.role == "assistant"
                else _TEXT_IN
                if item.role == "user"
                else _TEXT_SYSTEM
            )
            _check_parts(content, f"{where}.content", allowed, state)
    elif kind == "function_call" or kind == "custom_tool_call":
        _need(item.call_id, str, f"{where}.call_id", "a string")
        _need(item.name, str, f"{where}.name", "a string")
        if kind == "function_call":
            _need_text(item.arguments, f"{where}.arguments")
        else:
            _need_text(item.input, f"{where}.input")
        state.calls[item.call_id] = kind  # type: ignore[index]
    elif kind == "function_call_output" or kind == "custom_tool_call_output":
        _need(item.call_id, str, f"{where}.call_id", "a string")
        call = kind.removesuffix("_output")
        if state.calls.get(item.call_id) != call:
            raise InvalidRequest(
                f"{where}.call_id: no earlier {call} item has call_id {item.call_id!r}",
                param=f"{where}.call_id",
            )
        _check_output(item, f"{where}.output", state)
    elif kind == "reasoning":
        _need(item.summary, list, f"{where}.summary", "an array")
        _check_parts(item.summary, f"{where}.summary", frozenset(("summary_text",)), state)
        if item.content is not None:
            if type(item.content) is not list:
                raise InvalidRequest(f"{where}.content: must be an array", param=f"{where}.content")
            _check_parts(item.content, f"{where}.content", frozenset(("reasoning_text",)), state)
    elif kind == "compaction":
        _need(item.encrypted_content, str, f"{where}.encrypted_content", "a string")
        if unseal(item.encrypted_content) is None:
            raise InvalidRequest(
                f"{where}.encrypted_content: not a compaction this gateway made (it cannot"
                " read another server's); send the conversation itself, or compact it here",
                param=f"{where}.encrypted_content",
            )
    elif kind == TRIGGER:
        if where != state.last:
            raise InvalidRequest(
                f"{where}.type: a compaction_trigger must be the last input item",
                param=f"{where}.type",
            )
    elif kind in _UNSTORED:
        raise InvalidRequest(f"{where}.type: {kind}: {_UNSTORED[kind]}", param=f"{where}.type")
    else:
        raise InvalidRequest(
            f"{where}.type: unsupported item type {kind!r} (accepted: message, function_call,"
            " function_call_output, custom_tool_call, custom_tool_call_output, reasoning,"
            " compaction, compaction_trigger)",
            param=f"{where}.type",
        )


def _check_parts(parts: list[Part], where: str, allowed: frozenset, state: _Walk) -> None:
    state.count(len(parts), where)
    for j, p in enumerate(parts):
        at = f"{where}[{j}]"
        if p.type not in allowed:
            raise InvalidRequest(
                f"{at}.type: {p.type!r} is not accepted here (accepted: "
                f"{', '.join(sorted(allowed))})",
                param=f"{at}.type",
            )
        if p.type == "refusal":
            _need_text(p.refusal, f"{at}.refusal")
        elif p.type == "input_image":
            if not isinstance(p.image_url, str) or not p.image_url:
                what = "a file_id" if p.file_id is not None else "no image_url"
                raise InvalidRequest(
                    f"{at}: {what}: this gateway stores no files; send the image as an"
                    " image_url (a data: URL or an https URL)",
                    param=f"{at}.image_url",
                )
            if p.detail is not None:  # "low", "high", "auto": sent on as it came
                _need(p.detail, str, f"{at}.detail", "a string")
            state.images = True
        elif p.type == "input_file":
            raise InvalidRequest(
                f"{at}: input_file is not supported by a Chat Completions upstream; send the"
                " file's text as input_text",
                param=f"{at}.type",
            )
        else:
            _need_text(p.text, f"{at}.text")


def _check_output(item: Item, where: str, state: _Walk) -> None:
    out = item.output
    if len(out) == 0:
        raise InvalidRequest(f"{where}: a string or an array of parts is required", param=where)
    if is_string(out):
        return
    if memoryview(out)[0] != 91:  # '['
        raise InvalidRequest(f"{where}: a string or an array of parts is required", param=where)
    try:
        parts = _PARTS.decode(out)
    except msgspec.ValidationError as exc:
        text = str(exc)
        m = _AT.search(text)
        at = where + (m.group(1) if m else "")
        raise InvalidRequest(
            f"{at}: {text[: m.start()].rstrip(' -') if m else text}", param=at
        ) from None
    except (msgspec.DecodeError, RecursionError):
        raise InvalidRequest(f"{where}: nested too deeply", param=where) from None
    _check_parts(parts, where, _TEXT_IN, state)
    item.output = parts  # type: ignore[assignment]


def _check_tools(tools: list[Tool] | None, limits: Limits) -> None:
    if not tools:
        return
    n = 0
    room = limits.max_json_depth
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        inner = t.tools if t.type == "namespace" else None
        if t.type in ("function", "custom", "namespace"):
            _need(t.name, str, f"{where}.name", "a string")
        if t.type == "namespace":
            _need(inner, list, f"{where}.tools", "an array of functions")
            for j, f in enumerate(inner or ()):
                if f.type not in ("function", "custom") or not isinstance(f.name, str):
                    raise InvalidRequest(
                        f"{where}.tools[{j}]: a function or custom tool with a name is required",
                        param=f"{where}.tools[{j}]",
                    )
        n += len(inner) if inner else 1
        if t.type in ("function", "namespace") or t.type == "custom":
            for f in inner or (t,):
                if f.parameters and memoryview(f.parameters)[0] not in (123, 110):  # '{', 'n'
                    raise InvalidRequest(
                        f"{where}.parameters: must be an object", param=f"{where}.parameters"
                    )
                _deep(f.format, room, 3, f"{where}.format")
    if n > limits.max_tools:
        raise InvalidRequest(f"tools: at most {limits.max_tools} tools are accepted", param="tools")


def _check_tool_choice(tc: object) -> None:
    if tc is None or tc in ("auto", "none", "required"):
        return
    if isinstance(tc, dict) and isinstance(tc.get("type"), str):
        if tc["type"] in ("function", "custom") and not isinstance(tc.get("name"), str):
            raise InvalidRequest(
                "tool_choice.name: required for a function", param="tool_choice.name"
            )
        return
    raise InvalidRequest(
        "tool_choice: must be auto, none, required or an object with a type", param="tool_choice"
    )


def _deep(value: object, room: int, at: int, where: str) -> None:
    """``value`` sits at depth ``at`` (the body is depth 1): past the limit, refused."""
    if type(value) in (dict, list) and at - 1 + json_depth(value, room) > room:
        raise InvalidRequest(f"{where}: nested deeper than {room} levels", param=where)
