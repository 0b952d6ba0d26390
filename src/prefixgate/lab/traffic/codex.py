"""A Claude Code session's turns as Codex CLI sends the same conversation: OpenAI
Responses requests (``POST /v1/responses``), for the benchmarks and the tests of the
gateway's Responses path (``benchmarks/agent_turns.py --codex``).

Codex CLI sends its whole conversation every turn (``store: false``), the same
instructions and tools, and only appends items: no ``cache_control`` marker moves. Its
``session-id`` header and ``prompt_cache_key`` carry the conversation's id.
"""

from __future__ import annotations

import json

import msgspec

BILLING = "x-anthropic-billing-header"  # Claude Code's, not Codex's: left out
CODEX_HEADERS = {"originator": "codex_exec", "version": "0.171.0"}


def _text_of(content) -> str:
    """The text of a Messages content (a string, or blocks whose texts are joined)."""
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if isinstance(b, dict))


def as_codex(body: bytes, headers: dict) -> tuple[bytes, dict]:
    """A Claude Code turn (its body and headers) as Codex CLI would send the same
    conversation to ``/v1/responses``: the system blocks as ``instructions`` (the billing
    header left out), the tools as function tools, each message as Responses items in its
    order (a thinking block a ``reasoning`` item, a ``tool_use`` a ``function_call``, a
    ``tool_result`` a ``function_call_output``, a mid-conversation system message a
    ``developer`` message), ``store: false``, the session's id as ``prompt_cache_key`` and
    in the ``session-id`` header."""
    req = msgspec.json.decode(body)
    sid = headers["X-Claude-Code-Session-Id"]
    system = req.get("system")
    if isinstance(system, list):
        system = [b for b in system if not b.get("text", "").startswith(BILLING)]
    items: list[dict] = []
    for m in req["messages"]:
        role, content = m["role"], m["content"]
        if role == "system":
            part = {"type": "input_text", "text": _text_of(content)}
            items.append({"type": "message", "role": "developer", "content": [part]})
            continue
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        texts: list[str] = []
        kind = "output_text" if role == "assistant" else "input_text"
        for b in blocks:
            t = b.get("type")
            if t == "text":
                texts.append(b["text"])
            elif t == "thinking":
                summary = [{"type": "summary_text", "text": b.get("thinking", "")}]
                items.append({"type": "reasoning", "summary": summary})
            elif t == "tool_use":
                items.append(
                    {
                        "type": "function_call",
                        "name": b["name"],
                        "arguments": json.dumps(b.get("input", {}), separators=(",", ":")),
                        "call_id": b["id"],
                    }
                )
            elif t == "tool_result":
                output = _text_of(b.get("content", ""))
                items.append(
                    {"type": "function_call_output", "call_id": b["tool_use_id"], "output": output}
                )
        if texts:
            parts = [{"type": kind, "text": x} for x in texts]
            items.append({"type": "message", "role": role, "content": parts})
    tools = [
        {
            "type": "function",
            "name": t["name"],
            "description": t.get("description", ""),
            "parameters": t.get("input_schema", {"type": "object"}),
            "strict": False,
        }
        for t in req.get("tools") or ()
    ]
    codex = {
        "model": req["model"],
        "instructions": system if isinstance(system, str) else _text_of(system or []),
        "input": items,
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": sid,
    }
    return msgspec.json.encode(codex), {**CODEX_HEADERS, "session-id": sid}
