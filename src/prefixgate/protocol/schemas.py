"""Typed request models of the gateway's routes, and the OpenAPI document made from them.

These are the shapes the gateway accepts (unknown fields are allowed and passed on or
dropped). The hot path checks requests with the hand-written checks beside them
(``protocol/anthropic.py``, ``protocol/openai.py``), which give field-named messages; the
models here describe the same contract for clients and for schema-driven fuzzing.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from prefixgate import __version__

NonEmpty = Annotated[str, Meta(min_length=1)]
Positive = Annotated[int, Meta(ge=1)]


# -- Anthropic Messages ------------------------------------------------------------------
class CacheControl(Struct):
    type: Literal["ephemeral"]
    ttl: str | None = None


class TextBlock(Struct, tag_field="type", tag="text"):
    text: str
    cache_control: CacheControl | None = None


class Base64Source(Struct, tag_field="type", tag="base64"):
    media_type: str
    data: str


class UrlSource(Struct, tag_field="type", tag="url"):
    url: str


class ImageBlock(Struct, tag_field="type", tag="image"):
    source: Base64Source | UrlSource
    cache_control: CacheControl | None = None


class ToolUseBlock(Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(Struct, tag_field="type", tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] | None = None
    is_error: bool = False
    cache_control: CacheControl | None = None


class ThinkingBlock(Struct, tag_field="type", tag="thinking"):
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(Struct, tag_field="type", tag="redacted_thinking"):
    data: str


Block = (
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)


class AnthropicMessage(Struct):
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class AnthropicTool(Struct):
    name: NonEmpty
    input_schema: dict[str, Any]
    description: str | None = None
    cache_control: CacheControl | None = None


class ToolChoice(Struct):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(Struct):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class Metadata(Struct):
    user_id: str | None = None


class MessagesRequest(Struct):
    model: NonEmpty
    max_tokens: Positive
    messages: list[AnthropicMessage]
    system: str | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: Metadata | None = None
    thinking: Thinking | None = None


class CountTokensRequest(Struct):
    model: NonEmpty
    messages: list[AnthropicMessage]
    system: str | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None


# -- OpenAI Chat Completions -------------------------------------------------------------
class ChatMessage(Struct):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class StreamOptions(Struct):
    include_usage: bool = False


class ChatRequest(Struct):
    model: NonEmpty
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None


# -- OpenAI Responses --------------------------------------------------------------------
class InputText(Struct, tag_field="type", tag="input_text"):
    text: str


class InputImage(Struct, tag_field="type", tag="input_image"):
    image_url: str
    detail: Literal["auto", "low", "high"] | None = None


class OutputText(Struct, tag_field="type", tag="output_text"):
    text: str


class MessageItem(Struct, tag_field="type", tag="message"):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText | InputImage | OutputText]


class FunctionCallItem(Struct, tag_field="type", tag="function_call"):
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(Struct, tag_field="type", tag="function_call_output"):
    call_id: str
    output: str | list[InputText | InputImage]


class SummaryText(Struct, tag_field="type", tag="summary_text"):
    text: str


class ReasoningItem(Struct, tag_field="type", tag="reasoning"):
    summary: list[SummaryText]
    encrypted_content: str | None = None


class FunctionTool(Struct, tag_field="type", tag="function"):
    name: str
    parameters: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class Reasoning(Struct):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None


class ResponsesRequest(Struct):
    model: NonEmpty
    input: str | list[MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: Positive | None = None
    temperature: float | None = None
    top_p: float | None = None
    reasoning: Reasoning | None = None
    stream: bool = False
    store: bool | None = None
    prompt_cache_key: str | None = None


# -- the document ----------------------------------------------------------------------------
def _error_schemas() -> dict[str, Any]:
    return {
        "AnthropicError": {
            "type": "object",
            "required": ["type", "error"],
            "properties": {
                "type": {"const": "error"},
                "error": {
                    "type": "object",
                    "required": ["type", "message"],
                    "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
                },
            },
        },
        "OpenAIError": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["message", "type"],
                    "properties": {
                        "message": {"type": "string"},
                        "type": {"type": "string"},
                        "param": {"type": ["string", "null"]},
                        "code": {"type": ["string", "null"]},
                    },
                }
            },
        },
    }


def _operation(summary: str, request: str, error: str) -> dict[str, Any]:
    err = {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{error}"}}}}
    return {
        "post": {
            "summary": summary,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{request}"}}
                },
            },
            "responses": {
                "200": {
                    "description": "The response (JSON, or an SSE stream when `stream` is true).",
                    "content": {"application/json": {}, "text/event-stream": {}},
                },
                **{code: {"description": text, **err} for code, text in _ERROR_CODES},
            },
        }
    }


_ERROR_CODES = (
    ("400", "Invalid request"),
    ("401", "Missing or invalid API key"),
    ("403", "Model not allowed for the key"),
    ("404", "Model not served"),
    ("413", "Request too large"),
    ("429", "Rate limited"),
    ("502", "Upstream failed"),
    ("504", "Upstream timed out"),
)


def openapi_document() -> dict[str, Any]:
    _, components = msgspec.json.schema_components(
        [MessagesRequest, CountTokensRequest, ChatRequest, ResponsesRequest],
        ref_template="#/components/schemas/{name}",
    )
    components.update(_error_schemas())
    return {
        "openapi": "3.1.0",
        "info": {"title": "prefixgate", "version": __version__},
        "paths": {
            "/v1/messages": _operation("Anthropic Messages", "MessagesRequest", "AnthropicError"),
            "/v1/messages/count_tokens": _operation(
                "Anthropic token count", "CountTokensRequest", "AnthropicError"
            ),
            "/v1/chat/completions": _operation(
                "OpenAI Chat Completions", "ChatRequest", "OpenAIError"
            ),
            "/v1/responses": _operation("OpenAI Responses", "ResponsesRequest", "OpenAIError"),
        },
        "components": {
            "schemas": components,
            "securitySchemes": {
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
                "bearer": {"type": "http", "scheme": "bearer"},
            },
        },
        "security": [{"apiKey": []}, {"bearer": []}],
    }
