"""Anthropic Messages API: request checks and error shapes."""

from __future__ import annotations

import msgspec

from prefixgate.config import Limits
from prefixgate.errors import GatewayError, InvalidRequest
from prefixgate.protocol.common import type_name
from prefixgate.protocol.validate import check_count

# Anthropic's error type for each neutral kind, with its HTTP status.
_ERROR_TYPES = {
    "invalid_request_error": ("invalid_request_error", 400),
    "request_too_large": ("request_too_large", 413),
    "authentication_error": ("authentication_error", 401),
    "permission_error": ("permission_error", 403),
    "not_found_error": ("not_found_error", 404),
    "rate_limit_error": ("rate_limit_error", 429),
    "insufficient_quota": ("rate_limit_error", 429),  # a budget spent (spend/)
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


def model_list(names: list[str]) -> dict:
    """``GET /v1/models`` in Anthropic's shape."""
    data = [
        {"type": "model", "id": m, "display_name": m, "created_at": "1970-01-01T00:00:00Z"}
        for m in names
    ]
    return {
        "data": data,
        "has_more": False,
        "first_id": names[0] if names else None,
        "last_id": names[-1] if names else None,
    }


def error_event(err: GatewayError) -> bytes:
    """An SSE ``error`` event, for failures after the stream has started."""
    return b"event: error\ndata: " + error_bytes(err) + b"\n\n"


def check_messages_request(body: dict, limits: Limits) -> None:
    """Reject what cannot be served, with the field named. Unknown fields pass (they are
    dropped or passed on by the converter)."""
    model = body.get("model")
    if not (isinstance(model, str) and model != ""):
        raise InvalidRequest("model: a non-empty string is required", param="model")
    check_count(body, "max_tokens", required=True)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("messages: an array is required", param="messages")
    if not len(messages) <= limits.max_messages:
        raise InvalidRequest(
            f"messages: at most {limits.max_messages} messages are accepted", param="messages"
        )
    blocks = 0
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(m, dict):
            raise InvalidRequest(f"{where}: must be an object, got {type_name(m)}", param=where)
        if m.get("role") not in _ROLES:
            raise InvalidRequest(
                f"{where}.role: must be one of {', '.join(_ROLES)}", param=f"{where}.role"
            )
        content = m.get("content")
        if isinstance(content, list):
            blocks += len(content)
            for j, b in enumerate(content):
                _check_block(b, f"{where}.content.{j}")
        else:
            if not isinstance(content, str):
                raise InvalidRequest(
                    f"{where}.content: must be a string or an array of content blocks",
                    param=f"{where}.content",
                )
    system = body.get("system")
    if system is not None:
        if isinstance(system, list):
            blocks += len(system)
            for j, b in enumerate(system):
                if not (
                    isinstance(b, dict)
                    and b.get("type") == "text"
                    and isinstance(b.get("text"), str)
                ):
                    raise InvalidRequest(f"system.{j}: must be a text block", param=f"system.{j}")
        else:
            if not isinstance(system, str):
                raise InvalidRequest(
                    "system: must be a string or an array of text blocks", param="system"
                )
    if not blocks <= limits.max_blocks:
        raise InvalidRequest(f"at most {limits.max_blocks} content blocks are accepted")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise InvalidRequest("tools: must be an array", param="tools")
        if not len(tools) <= limits.max_tools:
            raise InvalidRequest(
                f"tools: at most {limits.max_tools} tools are accepted", param="tools"
            )
        for j, t in enumerate(tools):
            if not (isinstance(t, dict) and isinstance(t.get("name"), str)):
                raise InvalidRequest(
                    f"tools.{j}: must be an object with a name", param=f"tools.{j}"
                )
            schema = t.get("input_schema")
            if not (schema is None or isinstance(schema, dict)):
                raise InvalidRequest(
                    f"tools.{j}.input_schema: must be an object", param=f"tools.{j}.input_schema"
                )
    tc = body.get("tool_choice")
    if tc is not None:
        if not (isinstance(tc, dict) and tc.get("type") in ("auto", "any", "tool", "none")):
            raise InvalidRequest(
                "tool_choice: must be an object with type auto, any, tool or none",
                param="tool_choice",
            )
        if tc.get("type") == "tool" and not isinstance(tc.get("name"), str):
            raise InvalidRequest(
                "tool_choice.name: required for type tool", param="tool_choice.name"
            )
    for key in ("temperature", "top_p"):
        v = body.get(key)
        if not (v is None or (isinstance(v, int | float) and not isinstance(v, bool))):
            raise InvalidRequest(f"{key}: must be a number", param=key)
    tk = body.get("top_k")
    if not (tk is None or (isinstance(tk, int) and not isinstance(tk, bool))):
        raise InvalidRequest("top_k: must be an integer", param="top_k")
    ss = body.get("stop_sequences")
    if not (ss is None or (isinstance(ss, list) and all(isinstance(s, str) for s in ss))):
        raise InvalidRequest("stop_sequences: must be an array of strings", param="stop_sequences")
    if not isinstance(body.get("stream", False), bool):
        raise InvalidRequest("stream: must be a boolean", param="stream")
    md = body.get("metadata")
    if not (md is None or isinstance(md, dict)):
        raise InvalidRequest("metadata: must be an object", param="metadata")
    th = body.get("thinking")
    if not (th is None or isinstance(th, dict)):
        raise InvalidRequest("thinking: must be an object", param="thinking")


def check_count_tokens_request(body: dict, limits: Limits) -> None:
    check_messages_request({"max_tokens": 1, **body}, limits)


def _check_block(b: object, where: str) -> None:
    if not isinstance(b, dict):
        raise InvalidRequest(f"{where}: must be an object, got {type_name(b)}", param=where)
    btype = b.get("type")
    if not (isinstance(btype, str) and btype in _BLOCK_TYPES):
        raise InvalidRequest(f"{where}.type: unknown block type {btype!r}", param=f"{where}.type")
    if btype == "text":
        if not isinstance(b.get("text"), str):
            raise InvalidRequest(f"{where}.text: must be a string", param=f"{where}.text")
    elif btype == "tool_use":
        if not isinstance(b.get("id"), str):
            raise InvalidRequest(f"{where}.id: must be a string", param=f"{where}.id")
        if not isinstance(b.get("name"), str):
            raise InvalidRequest(f"{where}.name: must be a string", param=f"{where}.name")
    elif btype == "tool_result":
        if not isinstance(b.get("tool_use_id"), str):
            raise InvalidRequest(
                f"{where}.tool_use_id: must be a string", param=f"{where}.tool_use_id"
            )
        c = b.get("content")
        if not (c is None or isinstance(c, str | list)):
            raise InvalidRequest(
                f"{where}.content: must be a string or an array", param=f"{where}.content"
            )
        if isinstance(c, list):
            for k, inner in enumerate(c):
                _check_block(inner, f"{where}.content.{k}")
    elif btype == "image":
        src = b.get("source")
        if not (isinstance(src, dict) and src.get("type") in ("base64", "url")):
            raise InvalidRequest(
                f"{where}.source: must be a base64 or url source", param=f"{where}.source"
            )
    elif btype == "thinking" and not isinstance(b.get("thinking"), str):
        raise InvalidRequest(f"{where}.thinking: must be a string", param=f"{where}.thinking")
