"""OpenAI Chat Completions API: request checks and error shapes."""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec

from prefixgate.config import Limits
from prefixgate.errors import GatewayError, InvalidRequest
from prefixgate.protocol.common import check_body_bytes, json_depth, too_deep, type_name
from prefixgate.protocol.validate import check_count, check_number, not_json

_ERROR_TYPES = {
    "invalid_request_error": ("invalid_request_error", None),
    "request_too_large": ("invalid_request_error", "request_too_large"),
    "authentication_error": ("authentication_error", "invalid_api_key"),
    "permission_error": ("permission_error", "model_not_allowed"),
    "not_found_error": ("not_found_error", "model_not_found"),
    "rate_limit_error": ("rate_limit_error", "rate_limit_exceeded"),
    "insufficient_quota": ("insufficient_quota", "insufficient_quota"),
    "timeout_error": ("timeout_error", "upstream_timeout"),
    "overloaded_error": ("server_error", "overloaded"),
    "api_error": ("server_error", None),
}


def error_body(err: GatewayError) -> dict:
    etype, code = _ERROR_TYPES.get(err.kind, ("server_error", None))
    code = err.code or code
    return {"error": {"message": err.message, "type": etype, "param": err.param, "code": code}}


def error_bytes(err: GatewayError) -> bytes:
    return msgspec.json.encode(error_body(err))


def model_list(names: list[str]) -> dict:
    """``GET /v1/models`` in OpenAI's shape."""
    return {
        "object": "list",
        "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "prefixgate"} for m in names
        ],
    }


def error_chunk(err: GatewayError) -> bytes:
    """An SSE data line carrying an error, for failures after the stream has started."""
    return b"data: " + error_bytes(err) + b"\n\n"


# msgspec's " - at `$.where`" (or "$[0].where") ending a validation message
_AT = re.compile(r" - at `\$\.?([^`]*)`")

_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


# -- the passthrough body --------------------------------------------------------------
# A chat request goes upstream as it came, but for a few top-level fields (model, stream
# options, max_tokens). So only those are decoded: ``messages`` and ``tools``, nearly all
# of the bytes, stay raw JSON (``msgspec.Raw``, a view of the request bytes that encodes
# back verbatim), and their shape is checked by a typed decode that builds no Python
# objects for their contents. The gateway never walks into them on the request path, so
# the depth limit applies to what it decodes; the capture (after the send) and the
# ``prefix`` routing policy decode them in full (``materialize``).
_LAZY = frozenset(("messages", "tools"))
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ANY = msgspec.json.Decoder()
_SHAPES: dict[tuple, tuple[msgspec.json.Decoder, msgspec.json.Decoder]] = {}


def decode_chat_body(raw: bytes, limits: Limits) -> dict:
    """The chat request with its top-level fields decoded but ``messages`` and ``tools``."""
    check_body_bytes(raw, limits)
    try:
        top = _TOP.decode(raw)
    except msgspec.ValidationError:
        raise InvalidRequest("request body must be a JSON object") from None
    except msgspec.DecodeError as exc:
        raise not_json(raw, exc) from None
    except RecursionError:
        raise too_deep(limits) from None
    body = {}
    room = limits.max_json_depth - 1
    for key, value in top.items():
        if key in _LAZY:
            body[key] = value
            continue
        v = body[key] = _ANY.decode(value)
        if type(v) in (dict, list) and json_depth(v, room) > room:
            raise too_deep(limits)
    return body


def materialize(*bodies: dict) -> list[dict]:
    """The bodies with their raw fields decoded; a raw value shared by several bodies is
    decoded once and shared (the capture relies on that identity)."""
    done: dict[int, object] = {}
    out = []
    for body in bodies:
        if any(type(v) is msgspec.Raw for v in body.values()):
            body = dict(body)
            for k, v in body.items():
                if type(v) is msgspec.Raw:
                    if id(v) not in done:
                        try:
                            done[id(v)] = _ANY.decode(v)
                        except RecursionError:
                            raise InvalidRequest(f"{k}: nested too deeply", param=k) from None
                    body[k] = done[id(v)]
        out.append(body)
    return out


class ToolFunction(msgspec.Struct):
    """A chat tool's ``function`` as vLLM and OpenAI read it: a name, and a description and
    a JSON-schema object that stay raw (checked by their first byte, never decoded)."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    description: msgspec.Raw = msgspec.Raw()
    parameters: msgspec.Raw = msgspec.Raw()
    strict: bool | None = None


class Tool(msgspec.Struct):
    function: ToolFunction
    type: Literal["function"] = "function"


def _check_tool(tool: Tool, where: str) -> None:
    """What the struct cannot say of a raw tool: its description is a string, its
    parameters an object (either may be null or absent)."""
    f = tool.function
    if len(f.description) and memoryview(f.description)[0] not in b'"n':
        raise InvalidRequest(
            f"{where}.function.description: must be a string",
            param=f"{where}.function.description",
        )
    if len(f.parameters) and memoryview(f.parameters)[0] not in b"{n":
        raise InvalidRequest(
            f"{where}.function.parameters: must be a JSON Schema object",
            param=f"{where}.function.parameters",
        )


_PLAIN_TOOL = msgspec.json.Decoder(Tool)


def _shapes(limits: Limits) -> tuple[msgspec.json.Decoder, msgspec.json.Decoder]:
    key = (limits.max_messages, limits.max_blocks, limits.max_tools)
    shapes = _SHAPES.get(key)
    if shapes is None:
        part = dict[str, msgspec.Raw]
        parts = Annotated[list[part], msgspec.Meta(max_length=limits.max_blocks)]
        message = msgspec.defstruct(
            "ChatMessage",
            [("role", Literal[_ROLES]), ("content", str | parts | None, None)],
        )
        messages = Annotated[
            list[message], msgspec.Meta(min_length=1, max_length=limits.max_messages)
        ]
        tools = Annotated[list[Tool], msgspec.Meta(max_length=limits.max_tools)]
        shapes = _SHAPES[key] = (msgspec.json.Decoder(messages), msgspec.json.Decoder(tools))
    return shapes


def _check_raw(decoder: msgspec.json.Decoder, raw: msgspec.Raw, name: str):
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        text = str(exc)
        m = _AT.search(text)
        if m is None:
            raise InvalidRequest(f"{name}: {text}", param=name) from None
        where = name + m.group(1)
        raise InvalidRequest(f"{where}: {text[: m.start()]}", param=where) from None
    except RecursionError:
        raise InvalidRequest(f"{name}: nested too deeply", param=name) from None


def check_chat_request(body: dict, limits: Limits) -> None:
    model = body.get("model")
    if not (isinstance(model, str) and model != ""):
        raise InvalidRequest("model: a non-empty string is required", param="model")
    messages = body.get("messages")
    if type(messages) is msgspec.Raw:
        for_messages, for_tools = _shapes(limits)
        _check_raw(for_messages, messages, "messages")
        tools = body.get("tools")
        if type(tools) is msgspec.Raw:
            for i, tool in enumerate(_check_raw(for_tools, tools, "tools") or ()):
                _check_tool(tool, f"tools[{i}]")
        _check_scalars(body)
        return
    if not (isinstance(messages, list) and len(messages) > 0):
        raise InvalidRequest("messages: a non-empty array is required", param="messages")
    if not len(messages) <= limits.max_messages:
        raise InvalidRequest(
            f"messages: at most {limits.max_messages} messages are accepted", param="messages"
        )
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise InvalidRequest(f"{where}: must be an object, got {type_name(m)}", param=where)
        if m.get("role") not in _ROLES:
            raise InvalidRequest(
                f"{where}.role: must be one of {', '.join(_ROLES)}", param=f"{where}.role"
            )
        c = m.get("content")
        if not (c is None or isinstance(c, str | list)):
            raise InvalidRequest(
                f"{where}.content: must be a string, an array of parts or null",
                param=f"{where}.content",
            )
        if isinstance(c, list) and not (
            len(c) <= limits.max_blocks and all(isinstance(p, dict) for p in c)
        ):
            raise InvalidRequest(
                f"{where}.content: parts must be objects", param=f"{where}.content"
            )
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise InvalidRequest("tools: must be an array", param="tools")
        if not len(tools) <= limits.max_tools:
            raise InvalidRequest(
                f"tools: at most {limits.max_tools} tools are accepted", param="tools"
            )
        if not (all(isinstance(t, dict) for t in tools)):
            raise InvalidRequest("tools: each tool must be an object", param="tools")
        for i, t in enumerate(tools):
            raw = msgspec.json.encode(t)
            _check_tool(_check_raw(_PLAIN_TOOL, msgspec.Raw(raw), f"tools[{i}]"), f"tools[{i}]")
    _check_scalars(body)


def _check_scalars(body: dict) -> None:
    if not (isinstance(body.get("stream", False), bool | None)):
        raise InvalidRequest("stream: must be a boolean", param="stream")
    so = body.get("stream_options")
    if not (so is None or isinstance(so, dict)):
        raise InvalidRequest("stream_options: must be an object", param="stream_options")
    check_count(body, "max_tokens")
    check_count(body, "max_completion_tokens")
    check_number(body, "temperature", 0, 2)
    check_number(body, "top_p", 0, 1)
    n = body.get("n")
    if not (n is None or (type(n) is int and 1 <= n <= 128)):
        raise InvalidRequest("n: an integer from 1 to 128 is required", param="n")
