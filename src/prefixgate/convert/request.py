"""Anthropic Messages request → OpenAI Chat Completions request.

Rules that protect the upstream prefix cache:
- the output is a pure function of the input: the same logical prefix always gives
  byte-identical upstream JSON (dicts are built in one fixed key order; tool inputs are
  re-serialized canonically; ``cache_control`` markers, which move every turn, are dropped);
- ``role: "system"`` messages in the middle of the conversation stay where they are (never
  hoisted into the top system prompt, which would change the prefix on every turn);
- Anthropic-only fields (``cache_control``, ``context_management``, ``output_config``,
  ``safeguards``, ``defer_loading`` …) are dropped without error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from prefixgate.errors import InvalidRequest

_EFFORTS = ("low", "medium", "high")


@dataclass(frozen=True, slots=True)
class ConvertOptions:
    upstream_model: str
    thinking: str = "chat_template_kwargs"  # | "reasoning_effort" | "drop"
    history_thinking: str = "reasoning_content"  # | "drop"


def dumps(obj: object) -> str:
    """Canonical compact JSON used for tool-call arguments."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def system_text(system: object) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    return "\n".join(
        b.get("text", "") for b in system if isinstance(b, dict) and b.get("type") == "text"
    )


def anthropic_to_openai(body: dict, opts: ConvertOptions) -> dict:
    messages: list[dict] = []
    sys_text = system_text(body.get("system"))
    if sys_text:
        messages.append({"role": "system", "content": sys_text})
    for m in body.get("messages", ()):
        messages.extend(_convert_message(m, opts))

    out: dict = {"model": opts.upstream_model, "messages": messages}
    tools = [_convert_tool(t) for t in body.get("tools") or () if _is_function_tool(t)]
    if tools:
        out["tools"] = tools
    tc = body.get("tool_choice")
    if tc and tools:
        choice, parallel = _convert_tool_choice(tc)
        out["tool_choice"] = choice
        if parallel is not None:
            out["parallel_tool_calls"] = parallel
    out["max_tokens"] = body["max_tokens"]
    for src, dst in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k")):
        if body.get(src) is not None:
            out[dst] = body[src]
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    user = _user_of(body.get("metadata"))
    if user:
        out["user"] = user
    _apply_thinking(out, body, opts)
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def _user_of(metadata: object) -> str | None:
    if isinstance(metadata, dict):
        uid = metadata.get("user_id")
        if isinstance(uid, str) and uid:
            return uid
    return None


def _apply_thinking(out: dict, body: dict, opts: ConvertOptions) -> None:
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or opts.thinking == "drop":
        return
    enabled = thinking.get("type") in ("enabled", "adaptive")
    if opts.thinking == "chat_template_kwargs":
        out["chat_template_kwargs"] = {"enable_thinking": enabled}
    elif opts.thinking == "reasoning_effort" and enabled:
        out["reasoning_effort"] = _effort(thinking, body.get("output_config"))


def _effort(thinking: dict, output_config: object) -> str:
    if isinstance(output_config, dict) and output_config.get("effort") in _EFFORTS:
        return output_config["effort"]
    budget = thinking.get("budget_tokens")
    if isinstance(budget, int):
        return "low" if budget < 4096 else "medium" if budget < 16384 else "high"
    return "medium"


def _is_function_tool(tool: dict) -> bool:
    # Server tools (web search, code execution …) have a versioned type and no schema.
    ttype = tool.get("type")
    return ttype in (None, "custom") or "input_schema" in tool


def _convert_tool(tool: dict) -> dict:
    fn: dict = {"name": tool["name"]}
    if tool.get("description"):
        fn["description"] = tool["description"]
    fn["parameters"] = tool.get("input_schema") or {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def _convert_tool_choice(tc: dict) -> tuple[object, bool | None]:
    kind = tc.get("type")
    parallel = False if tc.get("disable_parallel_tool_use") else None
    if kind == "any":
        return "required", parallel
    if kind == "tool":
        return {"type": "function", "function": {"name": tc["name"]}}, parallel
    if kind == "none":
        return "none", None
    return "auto", parallel


def _convert_message(m: dict, opts: ConvertOptions) -> list[dict]:
    role = m["role"]
    content = m["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "assistant":
        return [_convert_assistant(content, opts)]
    if role == "system":
        return [{"role": "system", "content": _join_text(content)}]
    return _convert_user(content)


def _join_text(blocks: list) -> str:
    return "\n".join(b.get("text", "") for b in blocks if b.get("type") == "text")


def _convert_assistant(blocks: list, opts: ConvertOptions) -> dict:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict] = []
    for b in blocks:
        btype = b.get("type")
        if btype == "text":
            texts.append(b.get("text", ""))
        elif btype == "thinking":
            reasoning.append(b.get("thinking", ""))
        elif btype == "tool_use":
            calls.append(
                {
                    "id": b["id"],
                    "type": "function",
                    "function": {"name": b["name"], "arguments": dumps(b.get("input", {}))},
                }
            )
        # redacted_thinking and server-tool blocks cannot be replayed upstream: dropped.
    msg: dict = {"role": "assistant", "content": "".join(texts) if texts else None}
    if reasoning and opts.history_thinking == "reasoning_content":
        msg["reasoning_content"] = "".join(reasoning)
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
        btype = b.get("type")
        if btype == "tool_result":
            text, images = _tool_result_content(b)
            out.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": text})
            if images:
                parts.extend(images)
        elif btype == "text":
            parts.append({"type": "text", "text": b.get("text", "")})
        elif btype == "image":
            parts.append(_image_part(b))
        elif btype == "document":
            parts.append({"type": "text", "text": _document_text(b)})
    if parts:
        if all(p["type"] == "text" for p in parts) and len(parts) == 1:
            out.append({"role": "user", "content": parts[0]["text"]})
        else:
            out.append({"role": "user", "content": parts})
    return out


def _tool_result_content(b: dict) -> tuple[str, list[dict]]:
    content = b.get("content")
    images: list[dict] = []
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        pieces = []
        for inner in content:
            itype = inner.get("type")
            if itype == "text":
                pieces.append(inner.get("text", ""))
            elif itype == "image":
                images.append(_image_part(inner))
            elif itype == "document":
                pieces.append(_document_text(inner))
        text = "\n".join(pieces)
    if b.get("is_error"):
        text = f"Error: {text}" if text else "Error"
    return text, images


def _image_part(b: dict) -> dict:
    src = b.get("source") or {}
    if src.get("type") == "base64":
        url = f"data:{src.get('media_type', 'image/png')};base64,{src.get('data', '')}"
    elif src.get("type") == "url":
        url = src.get("url", "")
    else:
        raise InvalidRequest("image source must be base64 or url")
    return {"type": "image_url", "image_url": {"url": url}}


def _document_text(b: dict) -> str:
    src = b.get("source") or {}
    if src.get("type") == "text":
        return src.get("data", "")
    if src.get("type") == "content" and isinstance(src.get("content"), list):
        return _join_text(src["content"])
    title = b.get("title") or "document"
    return f"[{title}: {src.get('media_type', src.get('type', 'unsupported'))} content not supported upstream]"
