"""OpenAI Chat Completions API: request checks and error shapes."""

from __future__ import annotations

import msgspec

from prefixgate.config import Limits
from prefixgate.errors import GatewayError
from prefixgate.protocol.common import expect, type_name

_ERROR_TYPES = {
    "invalid_request_error": ("invalid_request_error", None),
    "request_too_large": ("invalid_request_error", "request_too_large"),
    "authentication_error": ("authentication_error", "invalid_api_key"),
    "permission_error": ("permission_error", "model_not_allowed"),
    "not_found_error": ("not_found_error", "model_not_found"),
    "rate_limit_error": ("rate_limit_error", "rate_limit_exceeded"),
    "timeout_error": ("timeout_error", "upstream_timeout"),
    "overloaded_error": ("server_error", "overloaded"),
    "api_error": ("server_error", None),
}


def error_body(err: GatewayError) -> dict:
    etype, code = _ERROR_TYPES.get(err.kind, ("server_error", None))
    if err.__class__.__name__ == "PromptTooLong":
        code = "context_length_exceeded"
    return {"error": {"message": err.message, "type": etype, "param": err.param, "code": code}}


def error_bytes(err: GatewayError) -> bytes:
    return msgspec.json.encode(error_body(err))


def error_chunk(err: GatewayError) -> bytes:
    """An SSE data line carrying an error, for failures after the stream has started."""
    return b"data: " + error_bytes(err) + b"\n\n"


_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def check_chat_request(body: dict, limits: Limits) -> None:
    model = body.get("model")
    expect(isinstance(model, str) and model != "", "model: a non-empty string is required", "model")
    messages = body.get("messages")
    expect(
        isinstance(messages, list) and len(messages) > 0,
        "messages: a non-empty array is required",
        "messages",
    )
    expect(
        len(messages) <= limits.max_messages,
        f"messages: at most {limits.max_messages} messages are accepted",
        "messages",
    )
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        expect(isinstance(m, dict), f"{where}: must be an object, got {type_name(m)}", where)
        expect(
            m.get("role") in _ROLES,
            f"{where}.role: must be one of {', '.join(_ROLES)}",
            f"{where}.role",
        )
        c = m.get("content")
        expect(
            c is None or isinstance(c, str | list),
            f"{where}.content: must be a string, an array of parts or null",
            f"{where}.content",
        )
        if isinstance(c, list):
            expect(
                len(c) <= limits.max_blocks and all(isinstance(p, dict) for p in c),
                f"{where}.content: parts must be objects",
                f"{where}.content",
            )
    tools = body.get("tools")
    if tools is not None:
        expect(isinstance(tools, list), "tools: must be an array", "tools")
        expect(
            len(tools) <= limits.max_tools,
            f"tools: at most {limits.max_tools} tools are accepted",
            "tools",
        )
        expect(
            all(isinstance(t, dict) for t in tools), "tools: each tool must be an object", "tools"
        )
    expect(
        isinstance(body.get("stream", False), bool | None), "stream: must be a boolean", "stream"
    )
    so = body.get("stream_options")
    expect(
        so is None or isinstance(so, dict), "stream_options: must be an object", "stream_options"
    )
    for key in ("temperature", "top_p", "max_tokens", "max_completion_tokens", "n"):
        v = body.get(key)
        expect(
            v is None or (isinstance(v, int | float) and not isinstance(v, bool)),
            f"{key}: must be a number",
            key,
        )
