"""OpenAI Chat Completions answer → OpenAI Responses answer: output items, the response
object around them, and the one-shot conversion (the stream's is ``responses_stream.py``).

A chat answer becomes, in this order, a ``reasoning`` item (the model's reasoning text,
as ``reasoning_text`` content: it is the reasoning itself, not a summary), a ``message``
item (its text) and a ``function_call`` item per tool call (a ``custom_tool_call`` for a
custom tool; a namespaced function named back as ``namespace`` + ``name``). Usage keeps
OpenAI's semantics, which the Responses API shares: ``input_tokens`` includes the cached
part, ``input_tokens_details.cached_tokens`` is the upstream's figure.
"""

from __future__ import annotations

import json
import secrets
import time

import msgspec

from prefixgate.apis.responses.compaction import compaction_item
from prefixgate.apis.responses.request import tool_map
from prefixgate.protocol.responses import ResponsesBody
from prefixgate.usage import Usage

ToolMap = dict[str, tuple[str, str | None, str]]

# Request fields a response echoes, with what it says when the request did not set them.
_ECHO = (
    ("instructions", None),
    ("max_output_tokens", None),
    ("parallel_tool_calls", True),
    ("previous_response_id", None),
    ("reasoning", {"effort": None, "summary": None}),
    ("temperature", None),
    ("text", {"format": {"type": "text"}}),
    ("tool_choice", "auto"),
    ("tools", []),
    ("top_p", None),
    ("truncation", "disabled"),
    ("metadata", {}),
)
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def response_base(body: ResponsesBody) -> dict:
    """The response object's fields that do not change while it is generated: ids, the
    public model name, and what the request set (raw, as it came)."""
    top = _TOP.decode(body.raw)
    base: dict = {
        "id": new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "model": body["model"],
        "output": [],
        "store": False,  # nothing is kept here, whatever the request asked
    }
    for key, default in _ECHO:
        value = top.get(key)
        base[key] = default if value is None or bytes(value) == b"null" else value
    base["usage"] = None
    return base


def status_of(finish: str | None) -> tuple[str, dict | None]:
    """The response's status and ``incomplete_details`` for a chat ``finish_reason``."""
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict:
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def text_part(text: str) -> dict:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def message_item(item_id: str, text: str | None, status: str = "completed") -> dict:
    content = [text_part(text)] if text is not None else []
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def call_item(
    item_id: str, call_id: str, chat_name: str, arguments: str, tools: ToolMap, status: str
) -> dict:
    """A ``function_call`` (or ``custom_tool_call``) item for a chat tool call."""
    kind, namespace, name = tools.get(chat_name, ("function", None, chat_name))
    if kind == "custom":
        return {
            "id": item_id,
            "type": "custom_tool_call",
            "status": status,
            "call_id": call_id,
            "name": name,
            "input": custom_input(arguments),
        }
    item = {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item


def custom_input(arguments: str) -> str:
    """A custom tool's text input from the ``{"input": …}`` arguments it was called with
    (the arguments themselves when the model wrote something else)."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return value["input"]
    return arguments


def chat_to_response(resp: dict, body: ResponsesBody) -> tuple[dict, Usage]:
    """A whole chat completion as a whole Responses answer, and the upstream's usage."""
    choices = resp.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    msg = choice.get("message") or {}
    status, incomplete = status_of(choice.get("finish_reason"))
    output: list[dict] = []
    text = msg.get("content")
    if body.compacting:  # one compaction item, whatever else the engine said
        status, incomplete = "completed", None
        output.append(compaction_item(text if isinstance(text, str) else ""))
        text, msg = None, {}
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        output.append(reasoning_item(new_id("rs"), reasoning))
    if isinstance(text, str) and text:
        output.append(message_item(new_id("msg"), text, status))
    tools = tool_map(body.typed)
    for call in msg.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        fn = call.get("function") or {}
        output.append(
            call_item(
                new_id("fc"),
                call.get("id") or new_id("call"),
                fn.get("name") or "",
                fn.get("arguments") or "",
                tools,
                "completed",
            )
        )
    usage = Usage.from_openai(resp.get("usage"))
    out = response_base(body)
    out.update(
        status=status,
        incomplete_details=incomplete,
        output=output,
        usage=usage.to_responses(),
    )
    return out, usage
