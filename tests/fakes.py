"""A scripted OpenAI-compatible upstream for gateway tests.

Each test sets ``upstream.script`` to a callable ``(body) -> Reply``; every request body is
kept in ``upstream.requests`` so tests can assert on exactly what the gateway sent.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Reply:
    """What the upstream answers. For streams, ``deltas`` are OpenAI ``delta`` dicts."""

    text: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict] | None = None  # [{"id","name","arguments"}]
    finish_reason: str = "stop"
    stop_reason: str | None = None
    prompt_tokens: int = 100
    cached_tokens: int | None = 0
    completion_tokens: int = 7
    status: int = 200
    error: dict | None = None  # body for a non-200 status
    headers: dict = field(default_factory=dict)
    deltas: list[dict] | None = None  # explicit stream deltas, overriding text/reasoning/tool_calls
    chunk_delay: float = 0.0
    hang_before: float = 0.0
    die_after: int | None = None  # stream: drop the connection after this many chunks
    raw_stream: list[bytes] | None = None  # stream: exact bytes to send
    hold: threading.Event | None = None  # stream: after the first chunk, wait until it is set


def usage_of(r: Reply) -> dict:
    u = {
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "total_tokens": r.prompt_tokens + r.completion_tokens,
    }
    if r.cached_tokens is not None:
        u["prompt_tokens_details"] = {"cached_tokens": r.cached_tokens}
    return u


def message_of(r: Reply) -> dict:
    msg: dict = {"role": "assistant", "content": r.text}
    if r.reasoning:
        msg["reasoning_content"] = r.reasoning
    if r.tool_calls:
        msg["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in r.tool_calls
        ]
    return msg


def deltas_of(r: Reply) -> list[dict]:
    if r.deltas is not None:
        return r.deltas
    out: list[dict] = [{"role": "assistant", "content": ""}]
    if r.reasoning:
        half = len(r.reasoning) // 2
        out += [
            {"reasoning_content": r.reasoning[:half]},
            {"reasoning_content": r.reasoning[half:]},
        ]
    if r.text:
        words = r.text.split(" ")
        out += [{"content": (" " if i else "") + w} for i, w in enumerate(words)]
    for i, c in enumerate(r.tool_calls or ()):
        out.append(
            {
                "tool_calls": [
                    {
                        "index": i,
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": ""},
                    }
                ]
            }
        )
        args = c["arguments"]
        mid = len(args) // 2
        out.append({"tool_calls": [{"index": i, "function": {"arguments": args[:mid]}}]})
        out.append({"tool_calls": [{"index": i, "function": {"arguments": args[mid:]}}]})
    return out


class ScriptedUpstream:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.raw: list[bytes] = []
        self.headers: list[dict] = []
        self.script = lambda body: Reply(text="Hello from upstream")
        self.cancelled = 0
        self.model_ids: list[str] | None = None  # GET /v1/models: None answers 404
        self.model_listings = 0
        self.tokenize_count: int | None = None  # POST /tokenize's count: None answers 404
        self.tokenized: list[dict] = []
        # what the Anthropic-compatible route reports as usage
        self.anthropic_usage = {
            "input_tokens": 10,
            "cache_read_input_tokens": 90,
            "cache_creation_input_tokens": 0,
            "output_tokens": 3,
        }
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/messages", self.messages, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/tokenize", self.tokenize, methods=["POST"]),
            ]
        )

    async def tokenize(self, request: Request) -> Response:
        """vLLM's ``/tokenize`` (at the server's root), answering ``tokenize_count``."""
        if self.tokenize_count is None:
            return JSONResponse({"error": {"message": "no such route"}}, status_code=404)
        self.tokenized.append(json.loads(await request.body()))
        n = self.tokenize_count
        return JSONResponse({"count": n, "max_model_len": 16384, "tokens": [1] * n})

    async def models(self, request: Request) -> Response:
        self.model_listings += 1
        self.headers.append(dict(request.headers))
        if self.model_ids is None:
            return JSONResponse({"error": {"message": "no such route"}}, status_code=404)
        return JSONResponse({"object": "list", "data": [{"id": m} for m in self.model_ids]})

    async def messages(self, request: Request) -> Response:
        """An Anthropic-compatible upstream (for passthrough channels)."""
        raw = await request.body()
        body = json.loads(raw)
        self.requests.append(body)
        self.raw.append(raw)
        self.headers.append(dict(request.headers))
        usage = dict(self.anthropic_usage)
        msg = {
            "id": "msg_up",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": "anthropic upstream"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            return JSONResponse(msg)

        def ev(name: str, data: dict) -> bytes:
            return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

        async def gen():
            yield ev(
                "message_start",
                {
                    "type": "message_start",
                    "message": {**msg, "content": [], "usage": {**usage, "output_tokens": 0}},
                },
            )
            yield ev(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            )
            yield ev(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "anthropic upstream"},
                },
            )
            yield ev("content_block_stop", {"type": "content_block_stop", "index": 0})
            yield ev(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
            )
            yield ev("message_stop", {"type": "message_stop"})

        return StreamingResponse(gen(), media_type="text/event-stream")

    async def chat(self, request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        self.requests.append(body)
        self.raw.append(raw)
        self.headers.append(dict(request.headers))
        r = self.script(body)
        if r.hang_before:
            try:
                await asyncio.sleep(r.hang_before)
            except asyncio.CancelledError:  # the gateway closed the connection meanwhile
                self.cancelled += 1
                raise
        if r.status != 200:
            return JSONResponse(
                r.error or {"error": {"message": "scripted failure"}},
                status_code=r.status,
                headers=r.headers,
            )
        if not body.get("stream"):
            return JSONResponse(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": 1,
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": message_of(r),
                            "finish_reason": r.finish_reason,
                            "stop_reason": r.stop_reason,
                        }
                    ],
                    "usage": usage_of(r),
                }
            )
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def gen():
            try:
                if r.raw_stream is not None:
                    for b in r.raw_stream:
                        yield b
                        await asyncio.sleep(r.chunk_delay)
                    return
                base = {
                    "id": "chatcmpl-1",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": body["model"],
                }
                deltas = deltas_of(r)
                for i, d in enumerate(deltas):
                    if r.die_after is not None and i >= r.die_after:
                        raise ConnectionResetError("scripted death")
                    last = i == len(deltas) - 1
                    choice = {
                        "index": 0,
                        "delta": d,
                        "finish_reason": r.finish_reason if last else None,
                    }
                    if last and r.stop_reason:
                        choice["stop_reason"] = r.stop_reason
                    yield b"data: " + json.dumps({**base, "choices": [choice]}).encode() + b"\n\n"
                    while i == 0 and r.hold is not None and not r.hold.is_set():
                        await asyncio.sleep(0.005)
                    if r.chunk_delay:
                        await asyncio.sleep(r.chunk_delay)
                if include_usage:
                    yield (
                        b"data: "
                        + json.dumps({**base, "choices": [], "usage": usage_of(r)}).encode()
                        + b"\n\n"
                    )
                yield b"data: [DONE]\n\n"
            except asyncio.CancelledError:
                self.cancelled += 1
                raise

        return StreamingResponse(gen(), media_type="text/event-stream")


class RecordingUpstream:
    """An ASGI wrapper that keeps each request's path, headers, JSON body (and its bytes,
    ``raw``), status and (for errors) the response body."""

    def __init__(self, app) -> None:
        self.app = app
        self.seen: list[dict] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body, out = bytearray(), bytearray()
        entry: dict = {"path": scope["path"], "headers": scope["headers"]}
        kept = read = False

        def keep() -> None:
            nonlocal kept
            if kept:
                return
            kept = True
            entry["raw"] = bytes(body)
            try:
                entry["body"] = json.loads(entry["raw"]) if body else None
            except ValueError:  # a body cut short
                entry["body"] = None
            entry["error"] = out.decode("utf-8", "replace") if out else None
            self.seen.append(entry)

        async def recv():
            nonlocal read
            msg = await receive()
            if msg["type"] == "http.request":
                body.extend(msg.get("body", b""))
                read = read or not msg.get("more_body", False)
            return msg

        # Kept before the answer goes, so that a client that has the whole answer finds
        # its request here (a stream's app returns after its last bytes, and its client
        # may have read to its end already): a success once its request was read whole,
        # an error (its body kept too) with its last bytes.
        async def snd(msg):
            if msg["type"] == "http.response.start":
                entry["status"] = msg["status"]
                if read and msg["status"] < 400:
                    keep()
            elif msg["type"] == "http.response.body":
                if entry.get("status", 200) >= 400:
                    out.extend(msg.get("body", b""))
                if not msg.get("more_body", False):
                    keep()
            await send(msg)

        try:
            await self.app(scope, recv, snd)
        finally:
            # Kept even when the call does not end by itself (a server stopped while the
            # answer's tail was still being forwarded: its client already had the answer).
            keep()

    def chats(self) -> list[dict]:
        return [e for e in self.seen if e["path"].endswith("/chat/completions")]
