"""Chat requests and replies of the simulated upstream: parsing, planning, wire shapes.

No I/O and no clocks here. :func:`parse_chat` validates a request body into a
:class:`ChatJob`; :func:`check_context` applies vLLM's context-window checks;
:func:`plan_reply` decides the whole output (text, reasoning, tool calls, finish reason,
output token ids) up front; :func:`stream_deltas` cuts it into SSE deltas; the remaining
functions build vLLM-shaped JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prefixgate.cache import Tokenizer
from prefixgate.cache.render import content_text

from .textgen import (
    cut_at_stop,
    piece_ids,
    prompt_rng,
    reasoning_pieces,
    text_pieces,
    tool_arguments,
)

__all__ = [
    "CALL_TRIGGER",
    "ChatJob",
    "Reply",
    "SimError",
    "ToolCall",
    "check_context",
    "chunk_body",
    "completion_body",
    "error_body",
    "parse_chat",
    "plan_reply",
    "stream_deltas",
    "usage_body",
]

CALL_TRIGGER = re.compile(r"\[\[call:([A-Za-z0-9_.\-]+)\]\]")
_ARG_FRAGMENT_CHARS = 12


class SimError(Exception):
    """A request the simulated upstream refuses, with vLLM's status, type and wording."""

    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.kind = kind


def error_body(err: SimError, *, nested: bool = False) -> dict[str, Any]:
    """vLLM's error JSON: flat ``{"object":"error",...}``, or (newer vLLM) nested under
    ``"error"``."""
    info = {"message": err.message, "type": err.kind, "param": None, "code": err.status}
    if nested:
        return {"error": info}
    return {"object": "error", **info}


@dataclass(slots=True)
class ChatJob:
    """A validated chat completion request."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    max_tokens: int | None = None
    ignore_eos: bool = False
    stops: list[str] = field(default_factory=list)
    include_stop: bool = False
    thinking: bool = False
    salt: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True


def _bad(message: str) -> SimError:
    return SimError(message)


def _opt_int(body: dict[str, Any], key: str) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(f"'{key}' must be an integer, not {type(v).__name__}")
    return v


def parse_chat(body: Any, default_model: str) -> ChatJob:
    """Validate a ``/v1/chat/completions`` body (raises :class:`SimError`)."""
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' is required and must be a non-empty list.")
    if not all(isinstance(m, dict) for m in messages):
        raise _bad("Each message must be an object.")
    model = body.get("model") or default_model
    if not isinstance(model, str):
        raise _bad("'model' must be a string.")
    tools = body.get("tools") or None
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)
    ):
        raise _bad("'tools' must be a list of objects.")
    tool_choice = body.get("tool_choice")
    if tool_choice not in (None, "none", "auto"):
        if tools is None:
            raise _bad("When using `tool_choice`, `tools` must be set.")
        if isinstance(tool_choice, dict):
            name = (tool_choice.get("function") or {}).get("name")
            if name not in _tool_names(tools):
                raise _bad(f"Tool '{name}' has not been passed in `tools`.")
        elif tool_choice != "required":
            raise _bad(f"Invalid value for `tool_choice`: {tool_choice!r}.")
    max_tokens = _opt_int(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise _bad(f"max_tokens must be at least 1, got {max_tokens}.")
    stop = body.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise _bad("'stop' must be a string or a list of strings.")
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise _bad("Parameter 'cache_salt' must be a non-empty string if provided.")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise _bad("'chat_template_kwargs' must be an object.")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise _bad("'stream_options' must be an object.")
    thinking = bool(kwargs.get("enable_thinking") or kwargs.get("thinking"))
    return ChatJob(
        model=model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        stream=bool(body.get("stream")),
        include_usage=bool(options.get("include_usage")),
        continuous_usage=bool(options.get("continuous_usage_stats")),
        max_tokens=max_tokens,
        ignore_eos=bool(body.get("ignore_eos")),
        stops=stops,
        include_stop=bool(body.get("include_stop_str_in_output")),
        thinking=thinking or body.get("reasoning_effort") is not None,
        salt=salt,
        template_kwargs=kwargs,
        add_generation_prompt=body.get("add_generation_prompt", True) is not False,
    )


def check_context(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> None:
    """vLLM's two context-window errors (same wording, numbers in the same places)."""
    if prompt_tokens > max_model_len or (max_tokens is None and prompt_tokens >= max_model_len):
        raise _bad(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {prompt_tokens} input tokens. Please reduce the length of the "
            "input messages."
        )
    if max_tokens is not None and prompt_tokens + max_tokens > max_model_len:
        raise _bad(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This "
            f"model's maximum context length is {max_model_len} tokens and your request has "
            f"{prompt_tokens} input tokens ({max_tokens} > {max_model_len} - {prompt_tokens})."
        )


# -- planning the reply ----------------------------------------------------------------


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text
    num_tokens: int = 0


@dataclass(slots=True)
class Reply:
    """The whole output of one request, decided before it "runs"."""

    reasoning: list[str]
    content: list[str]
    tool_calls: list[ToolCall]
    finish_reason: str
    stop_reason: str | None
    output_ids: list[int]

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def text(self) -> str:
        return "".join(self.content)

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning)


def _tool_names(tools: Sequence[dict[str, Any]]) -> list[str]:
    out = []
    for t in tools:
        fn = t.get("function")
        out.append(fn.get("name") if isinstance(fn, dict) else t.get("name"))
    return out


def _last_user_text(messages: Sequence[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            return content_text(m.get("content"))
    return ""


def select_tools(job: ChatJob) -> list[dict[str, Any]]:
    """The tools the reply calls: a named ``tool_choice``; else every ``[[call:Name]]``
    trigger in the last user message that names a given tool, while that message ends
    the conversation (once a tool's result follows it, the agent answers in text, as it
    would after its calls); with ``required`` and no trigger, the first tool.
    ``tool_choice="none"`` calls nothing."""
    if not job.tools or job.tool_choice == "none":
        return []
    by_name = dict(zip(_tool_names(job.tools), job.tools, strict=True))
    if isinstance(job.tool_choice, dict):
        return [by_name[job.tool_choice["function"]["name"]]]
    last = job.messages[-1].get("role") if job.messages else None
    text = _last_user_text(job.messages) if last == "user" else ""
    triggered = [by_name[n] for n in CALL_TRIGGER.findall(text) if n in by_name]
    if triggered:
        return triggered
    if job.tool_choice == "required":
        return [job.tools[0]]
    return []


def _budget(job: ChatJob, prompt_tokens: int, default: int, max_model_len: int) -> tuple[int, bool]:
    """Output tokens to generate, and whether that is a length stop."""
    room = max(max_model_len - prompt_tokens, 0)
    limit = job.max_tokens if job.max_tokens is not None else room
    if job.ignore_eos:
        n = job.max_tokens if job.max_tokens is not None else min(default, room)
        return n, True
    n = min(limit, default)
    return n, n >= limit


def plan_reply(
    job: ChatJob,
    prompt: Sequence[int],
    tokenizer: Tokenizer,
    *,
    default_output_tokens: int,
    max_model_len: int,
    seed: int = 0,
) -> Reply:
    """Decide the output of a request from its prompt tokens (deterministic)."""
    rng = prompt_rng(prompt, seed)
    n, at_limit = _budget(job, len(prompt), default_output_tokens, max_model_len)
    calls = select_tools(job)
    n_reason = 0
    if job.thinking:
        n_reason = n // 2 if n >= 2 else n
        if calls:
            n_reason = max(1, n_reason)
    reasoning = reasoning_pieces(rng, n_reason, tokenizer)
    ids = piece_ids(reasoning, tokenizer)
    if calls:
        tool_calls = []
        for tool in calls:
            name = _tool_names([tool])[0]
            args = json.dumps(tool_arguments(tool, rng), ensure_ascii=False)
            call_ids = tokenizer.encode(f'{{"name": "{name}", "arguments": {args}}}')
            ids.extend(call_ids)
            call_id = f"chatcmpl-tool-{rng.getrandbits(128):032x}"
            tool_calls.append(ToolCall(call_id, name, args, len(call_ids)))
        return Reply(reasoning, [], tool_calls, "tool_calls", None, ids)
    content = text_pieces(rng, n - n_reason, tokenizer)
    finish, stop_reason = ("length" if at_limit else "stop"), None
    if job.stops:
        content, matched = cut_at_stop(content, job.stops, include_stop=job.include_stop)
        if matched is not None:
            finish, stop_reason = "stop", matched
    ids.extend(piece_ids(content, tokenizer))
    return Reply(reasoning, content, [], finish, stop_reason, ids)


def stream_deltas(reply: Reply, chunk_tokens: int = 2) -> list[tuple[dict[str, Any], int]]:
    """The reply as SSE ``delta`` objects, each with the output tokens it carries (the role
    delta is not included; the last delta gets the finish reason)."""
    out: list[tuple[dict[str, Any], int]] = []
    step = max(1, chunk_tokens)
    for key, pieces in (("reasoning_content", reply.reasoning), ("content", reply.content)):
        for i in range(0, len(pieces), step):
            group = pieces[i : i + step]
            out.append(({key: "".join(group)}, len(group)))
    for index, call in enumerate(reply.tool_calls):
        head = {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        frags = [
            call.arguments[i : i + _ARG_FRAGMENT_CHARS]
            for i in range(0, len(call.arguments), _ARG_FRAGMENT_CHARS)
        ]
        per, extra = divmod(call.num_tokens, len(frags) + 1)
        out.append(({"tool_calls": [head]}, per + extra))
        for frag in frags:
            out.append(({"tool_calls": [{"index": index, "function": {"arguments": frag}}]}, per))
    if not out:
        out.append(({"content": ""}, 0))
    return out


# -- wire shapes (vLLM's) ------------------------------------------------------------------


def usage_body(
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    *,
    report_cached: bool,
    report_zero: bool = True,
) -> dict[str, Any]:
    """vLLM's usage object: ``prompt_tokens_details`` when the cache report is on, and
    (``report_zero``, vLLM ≥ 0.32) also when nothing hit."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if report_cached and (cached_tokens or report_zero):
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return usage


def completion_body(
    rid: str, created: int, model: str, reply: Reply, usage: dict[str, Any]
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if reply.tool_calls else reply.text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in reply.tool_calls
        ],
        "reasoning_content": reply.reasoning_text or None,
    }
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": reply.finish_reason,
                "stop_reason": reply.stop_reason,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage,
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


def chunk_body(
    rid: str,
    created: int,
    model: str,
    delta: dict[str, Any] | None,
    *,
    finish_reason: str | None = None,
    stop_reason: str | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``delta=None`` gives the usage-only final chunk."""
    body: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
    }
    if delta is None:
        body["choices"] = []
    else:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        body["choices"] = [choice]
    if usage is not None:
        body["usage"] = usage
    return body
