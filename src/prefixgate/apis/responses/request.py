"""OpenAI Responses request → OpenAI Chat Completions request.

The same rules that protect the upstream prefix cache on the Messages path:
- the output is a pure function of the input (dicts built in one fixed key order; texts
  leave as they came, ``msgspec.Raw``; function-call arguments are the very string the
  model produced); fields that move every turn and never reach the prompt
  (``client_metadata``, ``prompt_cache_key``, item ``id``s, ``store``, ``include``) are
  dropped;
- ``instructions`` and the leading run of system/developer messages become one system
  message (what Codex sends at the head of every request); a system or developer message
  later in the conversation stays where it is, never hoisted into the system prompt;
- the items of one assistant turn (reasoning, text, function calls) become one assistant
  message, so a turn the gateway answered comes back the same way on the next request;
- a ``compaction`` item (one this gateway made) becomes a user message holding its summary,
  and a closing ``compaction_trigger`` a user message asking for one, with the same tools
  and ``tool_choice: none`` (``apis/responses/compaction.py``).

Tool names: a ``namespace`` tool's functions are sent as ``<namespace>__<name>`` and a
``custom`` tool (free-form text input) as a function taking ``{"input": string}``;
:func:`tool_map` says how to read them back in the answer.
"""

from __future__ import annotations

import msgspec
from msgspec import Raw

from prefixgate.apis.messages.request import SessionTurns
from prefixgate.apis.responses import compaction
from prefixgate.convert.texts import ConvertOptions, Text, dumps, empty, join, truthy
from prefixgate.convert.texts import owned as _owned
from prefixgate.protocol.responses import TRIGGER, Item, Part, Request, Tool
from prefixgate.sequences import common_prefix

SEP = "__"  # between a namespace and a function name in a chat function name
_EFFORTS = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}
_CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
    "additionalProperties": False,
}
_ANY = msgspec.json.Decoder()


def chat_name(namespace: str | None, name: str) -> str:
    return f"{namespace}{SEP}{name}" if namespace else name


def tool_map(req: Request) -> dict[str, tuple[str, str | None, str]]:
    """For each chat function name that is not a plain function: ``(kind, namespace,
    name)``, kind ``function`` or ``custom`` (how the relay names the call it answers)."""
    out: dict[str, tuple[str, str | None, str]] = {}
    for t in req.tools or ():
        if t.type == "custom":
            out[t.name] = ("custom", None, t.name)
        elif t.type == "namespace":
            for f in t.tools or ():
                out[chat_name(t.name, f.name)] = (f.type, t.name, f.name)
    return out


class ResponsesTurn:
    """One session's latest converted Responses request (``SessionTurns``): its
    instructions and typed items, what they became (``system``: the system message, or
    None; ``flat``: the Chat messages after it), and before each item after the leading
    system ones, and after the last, how many of ``flat`` were made by then (``made``)
    and whether nothing was pending then (``clean``: no assistant turn being gathered, no
    images waiting): where a later turn's conversion may start again. Its typed tools and
    what they became; the body encoded from it (``encoded``; until then ``lent``, the
    previous turn's)."""

    __slots__ = (
        "instructions", "items", "lead", "system", "flat", "made", "clean", "tools",
        "chat_tools", "opts", "size", "tick", "out", "encoded", "lent",
    )  # fmt: skip

    def __init__(self, req: Request, opts: ConvertOptions) -> None:
        self.instructions = req.instructions
        self.items: list[Item] | None = req.input if type(req.input) is list else None
        self.lead = 0  # the leading system/developer items
        self.system: dict | None = None
        self.flat: list[dict] = []
        self.made: list[int] = []
        self.clean: list[bool] = []
        self.tools = req.tools
        self.chat_tools: list[dict] = []
        self.opts, self.size, self.tick = opts, 0, 0
        self.out: dict | None = None
        self.encoded = self.lent = None


def convert(
    req: Request,
    opts: ConvertOptions,
    previous: ResponsesTurn | None = None,
    turn: ResponsesTurn | None = None,
) -> dict:
    """The Chat request for a typed Responses request; texts stay raw. ``previous``: the
    session's previous turn (:func:`convert_lent`): when the instructions,
    the leading system items and the items after them up to a point where nothing was
    pending are equal (typed structs compared, raw texts by memcmp), the messages they
    became are taken as they were (the very objects) and only the rest is converted, so
    an edited history converts exactly as without it. ``turn`` is filled with what this
    request became, its texts copied out of the request's bytes."""
    messages: list[dict] = []
    head: list[Text] = [req.instructions] if req.instructions else []
    items = req.input
    if type(items) is str:
        _system(messages, head)
        messages.append({"role": "user", "content": items})
        if turn is not None:
            messages[:] = [_owned(m) for m in messages]
    else:
        i = 0
        while i < len(items) and items[i].type == "message" and items[i].role in _SYSTEM:
            head.append(_plain_text(items[i].content, "\n"))
            i += 1
        start = i  # the first item converted here
        made: list[int] = []
        clean: list[bool] = []
        before = previous.items if previous is not None else None
        k = -1  # how many leading items are the previous turn's (-1: none lent)
        if (
            previous is not None
            and before is not None
            and previous.lead == i
            and type(previous.instructions) is type(req.instructions)
            and previous.instructions == req.instructions
        ):
            k = common_prefix(items, before)
        if k >= i:  # the system message as it was, and the messages up to a clean point
            assert previous is not None
            start = next(m for m in range(k, i - 1, -1) if previous.clean[m - i])
            if previous.system is not None:
                messages.append(previous.system)
            base = len(messages)
            messages += previous.flat[: previous.made[start - i]]
            made, clean = previous.made[: start - i], previous.clean[: start - i]
        else:
            _system(messages, head)
            if turn is not None and messages:
                messages[0] = _owned(messages[0])
            base = len(messages)
        lent = len(messages)
        turns = _Turns(messages, opts)
        for item in items[start:]:
            made.append(len(messages) - base)
            clean.append(turns.clean())
            turns.add(item)
        made.append(len(messages) - base)
        clean.append(turns.clean())
        turns.flush()
        if turn is not None:
            messages[lent:] = [_owned(m) for m in messages[lent:]]
            turn.lead, turn.made, turn.clean = i, made, clean
            turn.system = messages[0] if base else None
            turn.flat = messages[base:]

    out: dict = {"model": opts.upstream_model, "messages": messages}
    if previous is not None and req.tools and _same_tools(previous.tools, req.tools):
        tools = previous.chat_tools  # the very list: its bytes and segments lent too
    else:
        tools = _tools(req.tools)
        if turn is not None:
            tools = [_owned(t) for t in tools]
    if turn is not None:
        turn.chat_tools = tools
    if tools:
        out["tools"] = tools
        if type(items) is list and items[-1].type == TRIGGER:
            out["tool_choice"] = "none"  # a summary, in text
        elif req.tool_choice is not None:
            out["tool_choice"] = _tool_choice(req.tool_choice)
        if req.parallel_tool_calls is not None:
            out["parallel_tool_calls"] = req.parallel_tool_calls
    if req.max_output_tokens is not None:
        out["max_tokens"] = req.max_output_tokens
    if req.temperature is not None:
        out["temperature"] = req.temperature
    if req.top_p is not None:
        out["top_p"] = req.top_p
    fmt = _response_format(req.text)
    if fmt is not None:
        out["response_format"] = fmt
    if req.user:
        out["user"] = req.user
    _apply_reasoning(out, req, opts)
    if req.stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


_SYSTEM = ("system", "developer")


def _system(messages: list[dict], head: list[Text]) -> None:
    texts = [t for t in head if not empty(t)]
    if texts:
        messages.append({"role": "system", "content": join(texts, "\n\n")})


def _plain_text(content: str | list[Part] | None, sep: str) -> Text:
    if content is None:
        return ""
    if type(content) is str:
        return content
    texts = [p.refusal if p.type == "refusal" else p.text for p in content if p.text or p.refusal]
    return join(texts, sep) if texts else ""


def _same_tools(a: list[Tool] | None, b: list[Tool]) -> bool:
    """The typed tools are equal, and so are their ``strict`` flags' types (``True == 1``,
    but only ``true`` is sent on as ``strict``). The very list (lent by the decode) is."""
    return a is b or (a == b and _stricts(a) == _stricts(b))


def _stricts(tools: list[Tool] | None) -> list[type]:
    return [type(f.strict) for t in tools or () for f in (t, *(t.tools or ()))]


def convert_lent(turns: SessionTurns, key: tuple, req: Request, opts: ConvertOptions, size: int):
    """:func:`convert`, lent what the same session's previous request converted
    (``turns``: the gateway's; ``key``: the session's, apart from a Messages session's)."""
    return turns.convert_other(key, ResponsesTurn, convert, req, opts, size)


class _Turns:
    """Items → chat messages: one assistant message per run of assistant-side items, tool
    messages for outputs, images from tool outputs in a user message after them."""

    __slots__ = ("out", "opts", "reasoning", "texts", "calls", "images")

    def __init__(self, out: list[dict], opts: ConvertOptions) -> None:
        self.out = out
        self.opts = opts
        self.reasoning: list[Text] = []
        self.texts: list[Text] | None = None  # the pending assistant's text, once it has one
        self.calls: list[dict] = []
        self.images: list[dict] = []  # from tool outputs, for a user message after them

    def add(self, item: Item) -> None:
        kind = item.type
        if kind == "function_call_output" or kind == "custom_tool_call_output":
            self._assistant()
            self.out.append(
                {"role": "tool", "tool_call_id": item.call_id, "content": self._output(item)}
            )
            return
        self._images()
        if kind == "message":
            role = item.role
            if role == "assistant":
                if self.calls or self.texts is not None:
                    self._assistant()
                self.texts = [_plain_text(item.content, "")]
                return
            self._assistant()
            if role == "user":
                self.out.append({"role": "user", "content": _user_content(item.content)})
            else:  # system / developer, in place
                self.out.append({"role": "system", "content": _plain_text(item.content, "\n")})
        elif kind == "reasoning":
            if self.opts.history_thinking == "drop":
                return
            if self.calls or self.texts is not None:
                self._assistant()
            parts = item.content or item.summary or ()
            self.reasoning.extend(p.text for p in parts if p.text)
        elif kind == "compaction" or kind == TRIGGER:
            self._assistant()
            text = (
                compaction.SUMMARY_HEAD + (compaction.unseal(item.encrypted_content) or "")
                if kind == "compaction"
                else compaction.SUMMARY_REQUEST
            )
            self.out.append({"role": "user", "content": text})
        elif kind == "function_call":
            args = item.arguments
            self.calls.append(_call(item.call_id, chat_name(item.namespace, item.name), args))
        else:  # custom_tool_call
            args = dumps({"input": _ANY.decode(item.input)})
            self.calls.append(_call(item.call_id, chat_name(item.namespace, item.name), args))

    def flush(self) -> None:
        self._assistant()
        self._images()

    def clean(self) -> bool:
        """Nothing pending: every message of the items added so far is out."""
        return not (self.reasoning or self.texts is not None or self.calls or self.images)

    def _assistant(self) -> None:
        if not (self.reasoning or self.texts is not None or self.calls):
            return
        texts = [t for t in self.texts or () if not empty(t)]
        msg: dict = {"role": "assistant", "content": join(texts, "") if texts else None}
        if self.reasoning:
            msg["reasoning_content"] = join(self.reasoning, "")
        if self.calls:
            msg["tool_calls"] = self.calls
        if msg["content"] is None and not self.calls:
            msg["content"] = ""
        self.out.append(msg)
        self.reasoning, self.texts, self.calls = [], None, []

    def _images(self) -> None:
        if self.images:
            self.out.append({"role": "user", "content": self.images})
            self.images = []

    def _output(self, item: Item) -> Text:
        out = item.output
        if type(out) is Raw:  # a string
            return out
        texts: list[Text] = []
        for p in out:
            if p.type == "input_image":
                self.images.append(_image(p))
            elif p.text:
                texts.append(p.text)
        return join(texts, "\n") if texts else ""


def _call(call_id: str | None, name: str, arguments: Text) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _user_content(content: str | list[Part] | None) -> Text | list[dict]:
    if content is None:
        return ""
    if type(content) is str:
        return content
    parts = [
        _image(p) if p.type == "input_image" else {"type": "text", "text": p.text} for p in content
    ]
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def _image(p: Part) -> dict:
    url: dict = {"url": p.image_url}
    if p.detail is not None:
        url["detail"] = p.detail
    return {"type": "image_url", "image_url": url}


def _tools(tools: list[Tool] | None) -> list[dict]:
    out: list[dict] = []
    for t in tools or ():
        if t.type in ("function", "custom"):
            out.append(_function(t.name, t))
        elif t.type == "namespace":
            out.extend(_function(chat_name(t.name, f.name), f) for f in t.tools or ())
        # hosted tools (web search, file search …) cannot run upstream: dropped
    return out


def _function(name: str, t: Tool) -> dict:
    fn: dict = {"name": name}
    if truthy(t.description):
        fn["description"] = t.description
    if t.type == "custom":
        fn["parameters"] = _CUSTOM_PARAMETERS
    else:
        schema = t.parameters
        fn["parameters"] = schema if truthy(schema) else {"type": "object", "properties": {}}
        if t.strict is True:
            fn["strict"] = True
    return {"type": "function", "function": fn}


def _tool_choice(tc: object) -> object:
    if isinstance(tc, str):
        return tc
    kind = tc.get("type")
    if kind in ("function", "custom"):
        name = chat_name(tc.get("namespace"), tc["name"])
        return {"type": "function", "function": {"name": name}}
    if kind == "allowed_tools":
        # The tools list stays whole (it is part of the cached prefix): only the mode.
        mode = tc.get("mode")
        return mode if mode in ("auto", "required") else "auto"
    return "auto"  # a hosted tool: not served upstream


def _response_format(text: dict | None) -> dict | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict):
        return None
    kind = fmt.get("type")
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema: dict = {"name": fmt.get("name") or "response"}
        for key in ("description", "schema", "strict"):
            if fmt.get(key) is not None:
                schema[key] = fmt[key]
        return {"type": "json_schema", "json_schema": schema}
    return None


def _apply_reasoning(out: dict, req: Request, opts: ConvertOptions) -> None:
    """``reasoning.effort`` as the channel maps thinking (as Anthropic ``thinking`` is):
    ``none`` turns it off; no effort given, nothing is said upstream."""
    r = req.reasoning
    effort = r.get("effort") if isinstance(r, dict) else None
    if not isinstance(effort, str) or opts.thinking == "drop":
        return
    enabled = effort != "none"
    if opts.thinking == "chat_template_kwargs":
        out["chat_template_kwargs"] = {"enable_thinking": enabled}
    elif opts.thinking == "reasoning_effort" and enabled:
        out["reasoning_effort"] = _EFFORTS.get(effort, "medium")
