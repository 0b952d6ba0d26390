"""Anthropic Messages request → OpenAI Chat Completions request.

Rules that protect the upstream prefix cache:
- the output is a pure function of the input: the same logical prefix always gives
  byte-identical upstream JSON (dicts are built in one fixed key order; tool inputs are
  re-serialized canonically; ``cache_control`` markers, which move every turn, are dropped);
- ``role: "system"`` messages in the middle of the conversation stay where they are (never
  hoisted into the top system prompt, which would change the prefix on every turn);
- Anthropic-only fields (``cache_control``, ``context_management``, ``output_config``,
  ``safeguards``, ``defer_loading`` …) are dropped without error.

The converter reads the typed request (``protocol/messages_body.py``): texts arrive as
``msgspec.Raw`` (JSON strings as the client wrote them) and leave the same way, so the
upstream body is assembled without unescaping or escaping the bulk of the prompt. Where
texts are joined, their JSON is joined (``convert/texts.py``'s ``join``). ``convert`` gives that raw-leaved dict
(what the gateway encodes and sends); ``anthropic_to_openai`` gives plain objects.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import msgspec
from msgspec import Raw

from prefixgate.convert.texts import ConvertOptions, Text, dumps, empty, join, truthy
from prefixgate.convert.texts import owned as _owned
from prefixgate.protocol.messages_body import (
    Decoded,
    DocumentBlock,
    ImageBlock,
    Lender,
    MessagesBody,
    Request,
    SystemBlock,
    TextBlock,
    ThinkingBlock,
    Tool,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
    is_string,
    typed_request,
)
from prefixgate.sequences import same_prefix

_EFFORTS = ("low", "medium", "high")


_ANY = msgspec.json.Decoder()
_encode = msgspec.json.encode


def system_text(system: object) -> str:
    """The system prompt of a plain request, as one string."""
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    return "\n".join(
        b.get("text", "") for b in system if isinstance(b, dict) and b.get("type") == "text"
    )


def anthropic_to_openai(body: dict, opts: ConvertOptions) -> dict:
    """A plain Messages request dict (or a ``MessagesBody``) → the Chat request, plain."""
    typed = body.typed if isinstance(body, MessagesBody) else typed_request(body)
    return plain(convert(typed, opts))


def plain(out: dict) -> dict:
    """A converted request with its raw texts decoded."""
    return _ANY.decode(_encode(out))


class _Encoded:
    """A turn's upstream body as encoded (``SessionTurns.encode``): the Chat messages it
    sent (the very objects), the body's bytes, where each message's JSON ends in them,
    and the tools list with its JSON."""

    __slots__ = ("head", "sent", "data", "ends", "tools", "tools_json")

    def __init__(
        self, head: bytes, sent: list, data: bytes, ends: list[int], tools, tools_json
    ) -> None:
        self.head, self.sent, self.data, self.ends = head, sent, data, ends
        self.tools, self.tools_json = tools, tools_json


class _Turn:
    """One session's latest converted request: its typed messages and what each became
    (``flat``: the Chat messages after the system one; ``ends``: how many of them each
    typed message's conversion ends at), its typed tools and what they became, and the
    body encoded from it (``encoded``; until then ``lent``, the previous turn's)."""

    __slots__ = (
        "messages", "converted", "flat", "ends", "system", "tools", "chat_tools", "opts",
        "size", "tick", "out", "encoded", "lent",
    )  # fmt: skip

    def __init__(self, req: Request, opts: ConvertOptions) -> None:
        self.messages: list = req.messages
        self.converted: list[list[dict]] = []
        self.flat: list[dict] = []
        self.ends: list[int] = []
        self.system: dict | None = None
        self.tools = req.tools
        self.chat_tools: list[dict] = []
        self.opts, self.size, self.tick = opts, 0, 0
        self.out: dict | None = None
        self.encoded: _Encoded | None = None
        self.lent: _Encoded | None = None


class SessionTurns(Lender):
    """Per session and channel, the latest request's messages and their conversion, so
    that the next turn converts only what is new: an agent re-sends its whole
    conversation every turn. A message equal to the one at the same place last turn (the
    typed structs compared, raw texts by memcmp) takes its conversion as it was; any other
    is converted afresh, so an edited history converts exactly as without this memory.
    Each session's entry costs three times its request's size: its typed messages are
    views of the request's bytes, what a message became holds its texts' own copy (a view
    would keep alive the body of the turn that first sent it, and so every earlier body
    of the session), and the upstream body encoded from it (:meth:`encode`), whose bytes
    the next turn takes for what it re-sends.

    Per session, the latest request as decoded too (:class:`~prefixgate.protocol.
    messages_body.Decoded`: its parts' own bytes and structs, and its body when the next
    request can be compared with it in place), which lends the next turn's decode what is
    equal. Both within ``budget`` bytes together, least recently used out first."""

    ENTRY = 256  # bytes an entry costs beyond its request

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.bytes = 0
        self._d: OrderedDict[tuple, Any] = OrderedDict()  # a _Turn, or another API's
        self._decoded: OrderedDict[object, tuple[int, Decoded]] = OrderedDict()
        self._tick = 0  # when an entry was kept: the older of the two tables' first goes

    def convert(self, key: tuple, req: Request, opts: ConvertOptions, size: int) -> dict:
        """:func:`convert`, lent what the same session's previous request converted."""
        return self.convert_other(key, _Turn, convert, req, opts, size)

    def convert_other(
        self, key: tuple, turn_type: type, convert_fn, req, opts: ConvertOptions, size: int
    ) -> dict:
        """An API's conversion to Chat (``convert_fn(req, opts, previous, turn)``, its turns
        of ``turn_type``: this module's, or the Responses API's), lent what the same
        session's previous request converted; both APIs' turns kept within the same budget
        (``key``: each API's own)."""
        prev = self._d.pop(key, None)
        if prev is not None:
            self.bytes -= prev.size
            if not isinstance(prev, turn_type) or prev.opts != opts:
                prev = None
        turn = turn_type(req, opts)
        out = convert_fn(req, opts, prev, turn)
        turn.out = out
        if prev is not None:
            turn.lent = prev.encoded
        # its typed parts (views of the request), its conversion's own texts, its body
        turn.size = size = 3 * size + self.ENTRY
        if size <= self.budget:
            self._tick += 1
            turn.tick = self._tick
            self._d[key] = turn
            self.bytes += size
            self._evict()
        return out

    def encode(self, key: tuple, out: dict) -> bytes:
        """The upstream body of ``out``, the request :meth:`convert` gave last for
        ``key``: the bytes of the Chat messages it re-sends as the very objects the
        previous turn sent are taken from that turn's body (one copy), only the rest is
        encoded. The same bytes as ``msgspec.json.encode(out)``."""
        turn = self._d.get(key)
        if turn is None or turn.out is not out:
            return _encode(out)
        if turn.encoded is None:
            turn.encoded = encode_lent(out, turn.lent)
            turn.lent = None
        return turn.encoded.data

    def decoded(self, key: object) -> Decoded | None:
        """The session's latest request as decoded (taken out: ``keep_decoded`` puts the
        next one back)."""
        got = self._decoded.pop(key, None)
        if got is None:
            return None
        self.bytes -= got[1].size
        return got[1]

    def keep_decoded(self, key: object, decoded: Decoded) -> None:
        if decoded.size > self.budget:
            return
        self._tick += 1
        self._decoded[key] = (self._tick, decoded)
        self.bytes += decoded.size
        self._evict()

    def _evict(self) -> None:
        d, dec = self._d, self._decoded
        while self.bytes > self.budget and (d or dec):
            turn = next(iter(d.values())) if d else None
            first = next(iter(dec.values())) if dec else None
            if turn is not None and (first is None or turn.tick < first[0]):
                d.popitem(last=False)
                self.bytes -= turn.size
            else:
                assert first is not None
                dec.popitem(last=False)
                self.bytes -= first[1].size

    def __len__(self) -> int:
        return len(self._d)


def convert(
    req: Request,
    opts: ConvertOptions,
    previous: _Turn | None = None,
    turn: _Turn | None = None,
) -> dict:
    """The Chat request for a typed Messages request; texts stay raw. ``previous``: the
    session's previous turn (:class:`SessionTurns`), whose conversions are taken for the
    messages (and the tools) that are equal; ``turn`` is filled with each message's
    conversion, its texts copied out of the request's bytes."""
    messages: list[dict] = []
    sys_text = _system(req.system)
    if not empty(sys_text):
        was = previous.system if previous is not None else None
        if (
            was is not None
            and type(was["content"]) is type(sys_text)
            and was["content"] == sys_text
        ):
            system = was  # the very object: its bytes are lent too (SessionTurns.encode)
        else:
            system = {"role": "system", "content": sys_text}
            if turn is not None:
                system = _owned(system)
        messages.append(system)
        if turn is not None:
            turn.system = system
    base = len(messages)
    msgs = req.messages
    before = previous.messages if previous is not None else ()
    n = len(before)
    # The leading messages the decode lent (the very structs sent last turn) take their
    # conversions at once; the walk starts after them.
    k = same_prefix(msgs, before) if n else 0
    if k:
        assert previous is not None
        messages += previous.flat[: previous.ends[k - 1]]
        if turn is not None:
            turn.converted = previous.converted[:k]
            turn.ends = previous.ends[:k]
    for i in range(k, len(msgs)):
        m = msgs[i]
        if i < n and (before[i] is m or before[i] == m):
            part = previous.converted[i]
        else:
            part = _convert_message(m, opts)
            if turn is not None:
                part = [_owned(p) for p in part]
        messages += part
        if turn is not None:
            turn.converted.append(part)
            turn.ends.append(len(messages) - base)
    if turn is not None:
        turn.flat = messages[base:]

    out: dict = {"model": opts.upstream_model, "messages": messages}
    if (
        previous is not None
        and req.tools
        and (previous.tools is req.tools or previous.tools == req.tools)
    ):
        tools = previous.chat_tools  # the very list: the capture lends its segments too
    else:
        tools = [_convert_tool(t) for t in req.tools or () if _is_function_tool(t)]
        if turn is not None:
            tools = [_owned(t) for t in tools]
    if turn is not None:
        turn.chat_tools = tools
    if tools:
        out["tools"] = tools
    tc = req.tool_choice
    if tc is not None and tools:
        choice, parallel = _convert_tool_choice(tc)
        out["tool_choice"] = choice
        if parallel is not None:
            out["parallel_tool_calls"] = parallel
    out["max_tokens"] = req.max_tokens
    for src, dst in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k")):
        value = getattr(req, src)
        if value is not None:
            out[dst] = value
    if req.stop_sequences:
        out["stop"] = list(req.stop_sequences)
    user = _user_of(req.metadata)
    if user:
        out["user"] = user
    _apply_thinking(out, req, opts)
    if req.stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def encode_lent(out: dict, lent: _Encoded | None) -> _Encoded:
    """``out`` (a request :func:`convert` gave) encoded, taking from ``lent`` (the
    previous turn's body) the bytes of the leading Chat messages that are the very objects
    it sent, and of the tools list when it is the very list: what is taken was encoded
    from those objects, so the bytes are those of ``msgspec.json.encode(out)``."""
    keys = iter(out)
    if next(keys, None) != "model" or next(keys, None) != "messages":
        data = _encode(out)
        return _Encoded(b"", [], data, [], None, None)
    msgs = out["messages"]
    head = b'{"model":' + _encode(out["model"]) + b',"messages":['
    k = same_prefix(msgs, lent.sent) if lent is not None and lent.head == head else 0
    pieces: list = []
    if k:
        assert lent is not None
        ends = lent.ends[:k]
        pos = ends[-1]
        pieces.append(memoryview(lent.data)[:pos])
    else:
        ends, pos = [], len(head)
        pieces.append(head)
    for i in range(k, len(msgs)):
        if i:
            pieces.append(b",")
            pos += 1
        one = _encode(msgs[i])
        pieces.append(one)
        pos += len(one)
        ends.append(pos)
    rest = {name: value for name, value in out.items() if name != "model" and name != "messages"}
    tools, tools_json = rest.get("tools"), None
    if tools is not None:
        same = lent is not None and lent.tools is tools and lent.tools_json is not None
        tools_json = lent.tools_json if same else _encode(tools)
        rest["tools"] = Raw(tools_json)
    tail = _encode(rest)
    if len(tail) == 2:  # {}
        pieces.append(b"]}")
    else:
        pieces.append(b"],")
        pieces.append(memoryview(tail)[1:])
    return _Encoded(head, list(msgs), b"".join(pieces), ends, tools, tools_json)


# -- texts as JSON -------------------------------------------------------------------------
def _prefixed(prefix: str, text: Text) -> Text:
    return prefix + text if type(text) is str else join([prefix, text], "")


def _as_text(raw: Raw, default: str = "") -> Text:
    """A raw value where the plain converter formats whatever it finds into a string."""
    if not raw:
        return default
    if is_string(raw):
        return raw
    return str(_ANY.decode(raw))


def _system(system: str | list[SystemBlock] | None) -> Text:
    if system is None:
        return ""
    if type(system) is str:
        return system
    if not system:
        return ""
    return join([b.text for b in system], "\n")


def _user_of(metadata: object) -> str | None:
    if isinstance(metadata, dict):
        uid = metadata.get("user_id")
        if isinstance(uid, str) and uid:
            return uid
    return None


def _apply_thinking(out: dict, req: Request, opts: ConvertOptions) -> None:
    thinking = req.thinking
    if not isinstance(thinking, dict) or opts.thinking == "drop":
        return
    enabled = thinking.get("type") in ("enabled", "adaptive")
    if opts.thinking == "chat_template_kwargs":
        out["chat_template_kwargs"] = {"enable_thinking": enabled}
    elif opts.thinking == "reasoning_effort" and enabled:
        out["reasoning_effort"] = _effort(thinking, req.output_config)


def _effort(thinking: dict, output_config: object) -> str:
    if isinstance(output_config, dict) and output_config.get("effort") in _EFFORTS:
        return output_config["effort"]
    budget = thinking.get("budget_tokens")
    if isinstance(budget, int):
        return "low" if budget < 4096 else "medium" if budget < 16384 else "high"
    return "medium"


def _is_function_tool(tool: Tool) -> bool:
    # Server tools (web search, code execution …) have a versioned type and no schema.
    return tool.type in (None, "custom") or bool(tool.input_schema)


def _convert_tool(tool: Tool) -> dict:
    fn: dict = {"name": tool.name}
    if truthy(tool.description):
        fn["description"] = tool.description
    schema = tool.input_schema
    fn["parameters"] = schema if truthy(schema) else {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def _convert_tool_choice(tc: ToolChoice) -> tuple[object, bool | None]:
    kind = tc.type
    parallel = False if tc.disable_parallel_tool_use else None
    if kind == "any":
        return "required", parallel
    if kind == "tool":
        return {"type": "function", "function": {"name": tc.name}}, parallel
    if kind == "none":
        return "none", None
    return "auto", parallel


def _convert_message(m, opts: ConvertOptions) -> list[dict]:
    role = m.role
    content = m.content
    if type(content) is str:
        return [{"role": role, "content": content}]
    if role == "assistant":
        return [_convert_assistant(content, opts)]
    if role == "system":
        texts = [b.text for b in content if type(b) is TextBlock]
        return [{"role": "system", "content": join(texts, "\n") if texts else ""}]
    return _convert_user(content)


def _convert_assistant(blocks: list, opts: ConvertOptions) -> dict:
    texts: list[Text] = []
    reasoning: list[Text] = []
    calls: list[dict] = []
    for b in blocks:
        kind = type(b)
        if kind is TextBlock:
            texts.append(b.text)
        elif kind is ThinkingBlock:
            reasoning.append(b.thinking)
        elif kind is ToolUseBlock:
            calls.append(
                {
                    "id": b.id,
                    "type": "function",
                    "function": {"name": b.name, "arguments": dumps(b.input)},
                }
            )
        # redacted_thinking and server-tool blocks cannot be replayed upstream: dropped.
    msg: dict = {"role": "assistant", "content": join(texts, "") if texts else None}
    if reasoning and opts.history_thinking == "reasoning_content":
        msg["reasoning_content"] = join(reasoning, "")
    if calls:
        msg["tool_calls"] = calls
    if msg["content"] is None and not calls:
        msg["content"] = ""
    return msg


def _convert_user(blocks: list) -> list[dict]:
    """Tool results become ``tool`` messages, placed first (OpenAI wants them right after
    the assistant's tool calls); the rest of the turn becomes one user message."""
    out: list[dict] = []
    parts: list[dict] = []
    for b in blocks:
        kind = type(b)
        if kind is ToolResultBlock:
            text, images = _tool_result_content(b)
            out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": text})
            if images:
                parts.extend(images)
        elif kind is TextBlock:
            parts.append({"type": "text", "text": b.text})
        elif kind is ImageBlock:
            parts.append(_image_part(b.source))
        elif kind is DocumentBlock:
            parts.append({"type": "text", "text": _document_text(b)})
    if parts:
        if len(parts) == 1 and parts[0]["type"] == "text":
            out.append({"role": "user", "content": parts[0]["text"]})
        else:
            out.append({"role": "user", "content": parts})
    return out


def _tool_result_content(b: ToolResultBlock) -> tuple[Text, list[dict]]:
    content = b.content
    images: list[dict] = []
    if content is None:
        text: Text = ""
    elif type(content) is Raw:  # a string
        text = content
    else:
        pieces: list[Text] = []
        for inner in content:
            kind = type(inner)
            if kind is TextBlock:
                pieces.append(inner.text)
            elif kind is ImageBlock:
                images.append(_image_part(inner.source))
            elif kind is DocumentBlock:
                pieces.append(_document_text(inner))
        text = join(pieces, "\n") if pieces else ""
    if b.is_error:
        text = "Error" if empty(text) else _prefixed("Error: ", text)
    return text, images


def _image_part(src) -> dict:
    if src.type == "base64":
        data = _as_text(src.data)
        url = join([f"data:{src.media_type};base64,", data], "")
    else:
        url = src.url
    return {"type": "image_url", "image_url": {"url": url}}


def _document_text(b: DocumentBlock) -> str:
    src = b.source or {}
    if src.get("type") == "text":
        data = src.get("data", "")
        return data if isinstance(data, str) else ""  # (a text that is not one: none)
    if src.get("type") == "content" and isinstance(src.get("content"), list):
        return "\n".join(
            x["text"]
            for x in src["content"]
            if isinstance(x, dict) and x.get("type") == "text" and isinstance(x.get("text"), str)
        )
    title = b.title or "document"
    return f"[{title}: {src.get('media_type', src.get('type', 'unsupported'))} content not supported upstream]"
