"""Anthropic Messages API: request checks and error shapes."""

from __future__ import annotations

import msgspec

from prefixgate.config import Limits
from prefixgate.errors import GatewayError
from prefixgate.protocol.common import expect, type_name

# Anthropic's error type for each neutral kind, with its HTTP status.
_ERROR_TYPES = {
    "invalid_request_error": ("invalid_request_error", 400),
    "request_too_large": ("request_too_large", 413),
    "authentication_error": ("authentication_error", 401),
    "permission_error": ("permission_error", 403),
    "not_found_error": ("not_found_error", 404),
    "rate_limit_error": ("rate_limit_error", 429),
    "timeout_error": ("api_error", 504),
    "overloaded_error": ("overloaded_error", 529),
    "api_error": ("api_error", 500),
}

_ROLES = ("user", "assistant", "system")
_BLOCK_TYPES = {
    "text",
    "image",
    "document",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
    "server_tool_use",
    "web_search_tool_result",
    "search_result",
    "container_upload",
}


def error_body(err: GatewayError) -> dict:
    etype, _ = _ERROR_TYPES.get(err.kind, ("api_error", 500))
    return {"type": "error", "error": {"type": etype, "message": err.message}}


def error_bytes(err: GatewayError) -> bytes:
    return msgspec.json.encode(error_body(err))


def error_event(err: GatewayError) -> bytes:
    """An SSE ``error`` event, for failures after the stream has started."""
    return b"event: error\ndata: " + error_bytes(err) + b"\n\n"


def check_messages_request(body: dict, limits: Limits) -> None:
    """Reject what cannot be served, with the field named. Unknown fields pass (they are
    dropped or passed on by the converter)."""
    model = body.get("model")
    expect(isinstance(model, str) and model != "", "model: a non-empty string is required", "model")
    mt = body.get("max_tokens")
    expect(
        isinstance(mt, int) and not isinstance(mt, bool) and mt >= 1,
        "max_tokens: a positive integer is required",
        "max_tokens",
    )
    messages = body.get("messages")
    expect(isinstance(messages, list), "messages: an array is required", "messages")
    expect(
        len(messages) <= limits.max_messages,
        f"messages: at most {limits.max_messages} messages are accepted",
        "messages",
    )
    blocks = 0
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        expect(isinstance(m, dict), f"{where}: must be an object, got {type_name(m)}", where)
        expect(
            m.get("role") in _ROLES,
            f"{where}.role: must be one of {', '.join(_ROLES)}",
            f"{where}.role",
        )
        content = m.get("content")
        if isinstance(content, list):
            blocks += len(content)
            for j, b in enumerate(content):
                _check_block(b, f"{where}.content.{j}")
        else:
            expect(
                isinstance(content, str),
                f"{where}.content: must be a string or an array of content blocks",
                f"{where}.content",
            )
    system = body.get("system")
    if system is not None:
        if isinstance(system, list):
            blocks += len(system)
            for j, b in enumerate(system):
                expect(
                    isinstance(b, dict)
                    and b.get("type") == "text"
                    and isinstance(b.get("text"), str),
                    f"system.{j}: must be a text block",
                    f"system.{j}",
                )
        else:
            expect(
                isinstance(system, str),
                "system: must be a string or an array of text blocks",
                "system",
            )
    expect(blocks <= limits.max_blocks, f"at most {limits.max_blocks} content blocks are accepted")
    tools = body.get("tools")
    if tools is not None:
        expect(isinstance(tools, list), "tools: must be an array", "tools")
        expect(
            len(tools) <= limits.max_tools,
            f"tools: at most {limits.max_tools} tools are accepted",
            "tools",
        )
        for j, t in enumerate(tools):
            expect(
                isinstance(t, dict) and isinstance(t.get("name"), str),
                f"tools.{j}: must be an object with a name",
                f"tools.{j}",
            )
            schema = t.get("input_schema")
            expect(
                schema is None or isinstance(schema, dict),
                f"tools.{j}.input_schema: must be an object",
                f"tools.{j}.input_schema",
            )
    tc = body.get("tool_choice")
    if tc is not None:
        expect(
            isinstance(tc, dict) and tc.get("type") in ("auto", "any", "tool", "none"),
            "tool_choice: must be an object with type auto, any, tool or none",
            "tool_choice",
        )
        if tc.get("type") == "tool":
            expect(
                isinstance(tc.get("name"), str),
                "tool_choice.name: required for type tool",
                "tool_choice.name",
            )
    for key in ("temperature", "top_p"):
        v = body.get(key)
        expect(
            v is None or (isinstance(v, int | float) and not isinstance(v, bool)),
            f"{key}: must be a number",
            key,
        )
    tk = body.get("top_k")
    expect(
        tk is None or (isinstance(tk, int) and not isinstance(tk, bool)),
        "top_k: must be an integer",
        "top_k",
    )
    ss = body.get("stop_sequences")
    expect(
        ss is None or (isinstance(ss, list) and all(isinstance(s, str) for s in ss)),
        "stop_sequences: must be an array of strings",
        "stop_sequences",
    )
    expect(isinstance(body.get("stream", False), bool), "stream: must be a boolean", "stream")
    md = body.get("metadata")
    expect(md is None or isinstance(md, dict), "metadata: must be an object", "metadata")
    th = body.get("thinking")
    expect(th is None or isinstance(th, dict), "thinking: must be an object", "thinking")


def check_count_tokens_request(body: dict, limits: Limits) -> None:
    check_messages_request({"max_tokens": 1, **body}, limits)


def _check_block(b: object, where: str) -> None:
    expect(isinstance(b, dict), f"{where}: must be an object, got {type_name(b)}", where)
    btype = b.get("type")
    expect(
        isinstance(btype, str) and btype in _BLOCK_TYPES,
        f"{where}.type: unknown block type {btype!r}",
        f"{where}.type",
    )
    if btype == "text":
        expect(isinstance(b.get("text"), str), f"{where}.text: must be a string", f"{where}.text")
    elif btype == "tool_use":
        expect(isinstance(b.get("id"), str), f"{where}.id: must be a string", f"{where}.id")
        expect(isinstance(b.get("name"), str), f"{where}.name: must be a string", f"{where}.name")
    elif btype == "tool_result":
        expect(
            isinstance(b.get("tool_use_id"), str),
            f"{where}.tool_use_id: must be a string",
            f"{where}.tool_use_id",
        )
        c = b.get("content")
        expect(
            c is None or isinstance(c, str | list),
            f"{where}.content: must be a string or an array",
            f"{where}.content",
        )
        if isinstance(c, list):
            for k, inner in enumerate(c):
                _check_block(inner, f"{where}.content.{k}")
    elif btype == "image":
        src = b.get("source")
        expect(
            isinstance(src, dict) and src.get("type") in ("base64", "url"),
            f"{where}.source: must be a base64 or url source",
            f"{where}.source",
        )
    elif btype == "thinking":
        expect(
            isinstance(b.get("thinking"), str),
            f"{where}.thinking: must be a string",
            f"{where}.thinking",
        )
