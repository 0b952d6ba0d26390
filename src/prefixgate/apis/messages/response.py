"""OpenAI Chat Completions response → Anthropic Messages response (non-streaming)."""

from __future__ import annotations

import json
import secrets

from prefixgate.convert.chunks import matched_stop
from prefixgate.usage import Usage

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def new_message_id() -> str:
    return "msg_" + secrets.token_hex(12)


def stop_reason(
    finish: str | None, matched: object, stop_sequences: list[str] | None
) -> tuple[str, str | None]:
    """Anthropic ``(stop_reason, stop_sequence)`` from OpenAI's ``finish_reason`` and vLLM's
    ``stop_reason`` or SGLang's ``matched_stop`` (the matched stop string, when one
    matched; a token id when an end token did)."""
    if (
        finish == "stop"
        and isinstance(matched, str)
        and stop_sequences
        and matched in stop_sequences
    ):
        return "stop_sequence", matched
    return STOP_REASONS.get(finish or "stop", "end_turn"), None


def parse_arguments(raw: str) -> dict:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"_raw_arguments": raw}
    return value if isinstance(value, dict) else {"_value": value}


def openai_to_anthropic(
    resp: dict,
    *,
    model: str,
    stop_sequences: list[str] | None = None,
    exclude_cache: bool = True,
) -> tuple[dict, Usage]:
    choices = resp.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    msg = choice.get("message") or {}
    content: list[dict] = []
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for call in msg.get("tool_calls") or ():
        fn = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or "toolu_" + secrets.token_hex(12),
                "name": fn.get("name", ""),
                "input": parse_arguments(fn.get("arguments") or ""),
            }
        )
    reason, seq = stop_reason(choice.get("finish_reason"), matched_stop(choice), stop_sequences)
    if msg.get("tool_calls") and reason == "end_turn":
        reason = "tool_use"
    usage = Usage.from_openai(resp.get("usage"))
    return (
        {
            "id": new_message_id(),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": seq,
            "usage": usage.to_anthropic(exclude_cache),
        },
        usage,
    )
