"""Load generation: request bodies, SSE stream parsers, and one streaming HTTP client.

The parsers are pure (no I/O): :meth:`StreamParser.feed` takes one SSE event and the
``time.perf_counter`` at which it arrived, and fills a
:class:`~prefixgate.lab.bench.specs.RequestResult` with vLLM's timing definitions:

- OpenAI Chat: the first ``data:`` chunk with a non-empty ``choices`` list sets TTFT (a
  role-only chunk counts, as in ``vllm bench serve``); each later ``choices`` chunk adds
  one ITL gap; a chunk with ``usage`` (``stream_options.include_usage``) gives the token
  counts; every event moves the "last event" time that ends E2EL.
- Anthropic Messages: the first ``content_block_delta`` sets TTFT, later ones add ITL
  gaps; ``message_delta.usage.output_tokens`` is the output count, and the prompt is
  ``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``.
- OpenAI Responses: the first output delta (text, reasoning, function arguments) sets
  TTFT, later ones add ITL gaps; the usage of ``response.completed`` (or
  ``response.incomplete``) gives the counts (``input_tokens`` includes the cached part).

Both also record the first visible (non-reasoning) output. :class:`BenchClient` holds one
``httpx.AsyncClient`` (one connection pool) and stamps the start of a request when it is
called, so callers take their concurrency gate first.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx

from .specs import RequestResult, RequestSpec, Target

__all__ = [
    "AnthropicStreamParser",
    "BenchClient",
    "OpenAIStreamParser",
    "SSEDecoder",
    "StreamParser",
    "anthropic_body",
    "ResponsesStreamParser",
    "openai_body",
    "parser_for",
    "responses_body",
]


# -- request bodies -------------------------------------------------------------------------


def openai_body(spec: RequestSpec, model: str, *, ignore_eos: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [dict(m) for m in spec.messages],
        "max_tokens": spec.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": spec.thinking},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def anthropic_body(spec: RequestSpec, model: str) -> dict[str, Any]:
    """Anthropic has no ``ignore_eos``: the output length rests on ``max_tokens``."""
    msgs = list(spec.messages)
    system = [m["content"] for m in msgs if m["role"] == "system"]
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": spec.max_tokens,
        "temperature": 0,
        "stream": True,
        "messages": [
            {"role": m["role"], "content": m["content"]} for m in msgs if m["role"] != "system"
        ],
    }
    if system:
        body["system"] = "\n\n".join(system)
    if spec.thinking:
        body["thinking"] = {"type": "enabled", "budget_tokens": max(1, spec.max_tokens - 1)}
    else:
        body["thinking"] = {"type": "disabled"}
    return body


def responses_body(spec: RequestSpec, model: str) -> dict[str, Any]:
    """The Responses API has no ``ignore_eos`` either; a leading system message becomes
    ``instructions``, thinking a reasoning effort (``none`` turns it off)."""
    msgs = list(spec.messages)
    system = [m["content"] for m in msgs if m["role"] == "system"]
    body: dict[str, Any] = {
        "model": model,
        "input": [
            {"role": m["role"], "content": m["content"]} for m in msgs if m["role"] != "system"
        ],
        "max_output_tokens": spec.max_tokens,
        "temperature": 0,
        "stream": True,
        "store": False,
        "reasoning": {"effort": "medium" if spec.thinking else "none"},
    }
    if system:
        body["instructions"] = "\n\n".join(system)
    return body


# -- SSE ------------------------------------------------------------------------------------


class SSEDecoder:
    """Lines in, ``(event, data)`` out: an event is dispatched at its blank line; multiple
    ``data:`` lines join with newlines; comments (``:``) are skipped."""

    def __init__(self) -> None:
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, line: str) -> tuple[str | None, str] | None:
        line = line.rstrip("\r\n")
        if not line:
            if not self._data:
                self._event = None
                return None
            out = (self._event, "\n".join(self._data))
            self._event, self._data = None, []
            return out
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        return None

    def flush(self) -> tuple[str | None, str] | None:
        return self.feed("")


# -- parsers --------------------------------------------------------------------------------


class StreamParser:
    """Common timeline bookkeeping; subclasses read the events."""

    def __init__(self, result: RequestResult) -> None:
        self.result = result
        self._first: float | None = None
        self._last_event: float | None = None
        self._text: list[str] = []

    def feed(self, event: str | None, data: str, ts: float) -> None:
        raise NotImplementedError

    def _chunk(self, ts: float) -> None:
        """A token-bearing chunk: TTFT on the first, an ITL gap on the others."""
        r = self.result
        r.chunks += 1
        if self._first is None:
            self._first = ts
            r.ttft = ts - r.start
        elif self._last_event is not None:
            r.itl.append(ts - self._last_event)

    def _visible(self, ts: float, text: str) -> None:
        if self.result.ttft_visible is None:
            self.result.ttft_visible = ts - self.result.start
        self._text.append(text)

    def _object(self, data: str) -> dict[str, Any] | None:
        """An event's JSON object (None for another JSON value; malformed data fails)."""
        try:
            body = json.loads(data)
        except ValueError:
            self._fail(f"malformed SSE data: {data[:200]!r}")
            return None
        return body if isinstance(body, dict) else None

    def _fail(self, message: str) -> None:
        if not self.result.error:
            self.result.error = message

    def finish(self) -> RequestResult:
        r = self.result
        r.text = "".join(self._text)
        if self._last_event is not None:
            r.latency = self._last_event - r.start
        if not r.error and self._first is None:
            r.error = "stream ended without output"
        if not r.usage_seen and not r.error:
            r.output_tokens = r.chunks  # a lower bound; flagged by usage_seen=False
        r.success = not r.error
        return r


class OpenAIStreamParser(StreamParser):
    def feed(self, event: str | None, data: str, ts: float) -> None:
        if data.strip() == "[DONE]":
            return
        chunk = self._object(data)
        if chunk is None:
            return
        if "error" in chunk or chunk.get("object") == "error":
            err = chunk.get("error", chunk)
            self._fail(f"stream error: {err.get('message', err) if isinstance(err, dict) else err}")
        choices = chunk.get("choices")
        if choices:
            self._chunk(ts)
            choice = choices[0] if isinstance(choices[0], dict) else {}
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                self.result.reasoning_chars += len(reasoning)
            content = delta.get("content")
            if content or delta.get("tool_calls"):
                self._visible(ts, content or "")
            if choice.get("finish_reason"):
                self.result.finish_reason = choice["finish_reason"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            r = self.result
            r.usage_seen = True
            r.input_tokens = int(usage.get("prompt_tokens") or 0)
            r.output_tokens = int(usage.get("completion_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            r.cached_tokens = int(details.get("cached_tokens") or 0)
        self._last_event = ts


class AnthropicStreamParser(StreamParser):
    def feed(self, event: str | None, data: str, ts: float) -> None:
        body = self._object(data)
        if body is None:
            return
        kind = body.get("type") or event
        if kind == "content_block_delta":
            self._chunk(ts)
            delta = body.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "thinking_delta":
                self.result.reasoning_chars += len(delta.get("thinking") or "")
            elif dtype == "text_delta":
                if delta.get("text"):
                    self._visible(ts, delta["text"])
            elif dtype == "input_json_delta":
                self._visible(ts, "")
        elif kind == "message_start":
            self._usage((body.get("message") or {}).get("usage"), final=False)
        elif kind == "message_delta":
            self._usage(body.get("usage"), final=True)
            reason = (body.get("delta") or {}).get("stop_reason")
            if reason:
                self.result.finish_reason = reason
        elif kind == "error":
            err = body.get("error") or {}
            self._fail(f"stream error: {err.get('type', '')}: {err.get('message', '')}".strip())
        self._last_event = ts

    def _usage(self, usage: Any, *, final: bool) -> None:
        if not isinstance(usage, dict):
            return
        r = self.result
        read = int(usage.get("cache_read_input_tokens") or 0)
        write = int(usage.get("cache_creation_input_tokens") or 0)
        prompt = int(usage.get("input_tokens") or 0) + read + write
        # message_start may carry zeros or an estimate; message_delta has the real figures.
        if prompt:
            r.input_tokens, r.cached_tokens = prompt, read
        if usage.get("output_tokens") is not None:
            r.output_tokens = int(usage["output_tokens"])
            r.usage_seen = r.usage_seen or final


class ResponsesStreamParser(StreamParser):
    _FINISH = {"max_output_tokens": "length", "content_filter": "content_filter"}

    def feed(self, event: str | None, data: str, ts: float) -> None:
        body = self._object(data)
        if body is None:
            return
        kind = body.get("type") or event
        if kind == "response.output_text.delta":
            self._chunk(ts)
            self._visible(ts, body.get("delta") or "")
        elif kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            self._chunk(ts)
            self.result.reasoning_chars += len(body.get("delta") or "")
        elif kind == "response.function_call_arguments.delta":
            self._chunk(ts)
            self._visible(ts, "")
        elif kind in ("response.completed", "response.incomplete"):
            resp = body.get("response") or {}
            self._usage(resp.get("usage"))
            reason = (resp.get("incomplete_details") or {}).get("reason")
            self.result.finish_reason = self._FINISH.get(reason, "stop") if reason else "stop"
        elif kind in ("response.failed", "error"):
            err = (body.get("response") or {}).get("error") or body
            self._fail(f"stream error: {err.get('code') or ''}: {err.get('message', '')}".strip())
        self._last_event = ts

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        r = self.result
        r.usage_seen = True
        r.input_tokens = int(usage.get("input_tokens") or 0)
        r.output_tokens = int(usage.get("output_tokens") or 0)
        r.cached_tokens = int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)


_PARSERS = {
    "openai": OpenAIStreamParser,
    "anthropic": AnthropicStreamParser,
    "responses": ResponsesStreamParser,
}


def parser_for(api: str, result: RequestResult) -> StreamParser:
    parser = _PARSERS.get(api)
    if parser is None:
        raise ValueError(f"api must be openai, anthropic or responses, not {api!r}")
    return parser(result)


# -- the client -----------------------------------------------------------------------------


class BenchClient:
    """Streams :class:`RequestSpec` s to one target over one connection pool.

    ``async with BenchClient(target, model) as c: result = await c.send(spec)``. Never
    raises for a failed request: the error is in ``result.error``."""

    def __init__(
        self,
        target: Target,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 600.0,
        max_connections: int = 256,
        ignore_eos: bool = True,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.target = target
        self.model = model
        self.ignore_eos = ignore_eos
        self.url = target.endpoint()
        self._headers = {"accept": "text/event-stream"}
        if target.api == "anthropic":
            self._headers["anthropic-version"] = "2023-06-01"
            if api_key:
                self._headers["x-api-key"] = api_key
        elif api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._own = http is None
        if http is None:
            # TCP_NODELAY: a request's body must not wait behind its headers (Nagle)
            transport = httpx.AsyncHTTPTransport(
                limits=httpx.Limits(
                    max_connections=max_connections, max_keepalive_connections=max_connections
                ),
                socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            )
            http = httpx.AsyncClient(
                timeout=httpx.Timeout(timeout, connect=30.0), transport=transport
            )
        self.http = http

    def __repr__(self) -> str:  # never the key
        return f"BenchClient({self.target.name!r}, {self.url!r}, model={self.model!r})"

    async def __aenter__(self) -> BenchClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own:
            await self.http.aclose()

    def body(self, spec: RequestSpec) -> dict[str, Any]:
        if self.target.api == "anthropic":
            return anthropic_body(spec, self.model)
        if self.target.api == "responses":
            return responses_body(spec, self.model)
        return openai_body(spec, self.model, ignore_eos=self.ignore_eos)

    async def send(self, spec: RequestSpec) -> RequestResult:
        body = self.body(spec)
        result = RequestResult(
            label=spec.label, session=spec.session, turn=spec.turn, max_tokens=spec.max_tokens
        )
        parser = parser_for(self.target.api, result)
        decoder = SSEDecoder()
        result.start = time.perf_counter()
        try:
            async with self.http.stream(
                "POST", self.url, json=body, headers=self._headers
            ) as response:
                result.status = response.status_code
                if response.status_code != 200:
                    raw = await response.aread()
                    result.error = (
                        f"HTTP {response.status_code}: {raw[:300].decode(errors='replace')}"
                    )
                    return parser.finish()
                async for line in response.aiter_lines():
                    event = decoder.feed(line)
                    if event is not None:
                        parser.feed(event[0], event[1], time.perf_counter())
                tail = decoder.flush()
                if tail is not None:
                    parser.feed(tail[0], tail[1], time.perf_counter())
        except httpx.HTTPError as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        return parser.finish()

    async def first_model(self) -> str:
        """The first model the target lists (``GET /v1/models``)."""
        response = await self.http.get(self.target.models_url(), headers=self._headers)
        response.raise_for_status()
        data = response.json().get("data") or []
        if not data:
            raise ValueError(f"{self.target.models_url()} lists no models")
        return str(data[0]["id"])
