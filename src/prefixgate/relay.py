"""Relaying an open upstream response back to the client, in the client's protocol.

Each relay reads the upstream with the channel's idle timeout, converts (or passes
through), keeps the raw upstream usage for the record, and closes the record when the
response ends, fails, or the client goes away (the upstream request is then cancelled by
closing its connection).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import msgspec
from starlette.responses import Response, StreamingResponse

from prefixgate.convert.response import openai_to_anthropic
from prefixgate.convert.stream import AnthropicStream
from prefixgate.errors import GatewayError, UpstreamError
from prefixgate.protocol import anthropic as anthropic_proto
from prefixgate.protocol import openai as openai_proto
from prefixgate.sse import SSEDecoder
from prefixgate.upstream import UpstreamResponse, map_status
from prefixgate.usage import Usage

if TYPE_CHECKING:
    from prefixgate.config import ChannelConfig
    from prefixgate.gateway import Gateway
    from prefixgate.record import Record

_decode = msgspec.json.decode
_encode = msgspec.json.encode
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


async def first_chunk(resp: UpstreamResponse, timeout: float) -> bytes:
    try:
        chunk = await resp.next(timeout, first=True)
    except BaseException:
        await resp.aclose()
        raise
    if chunk is None:
        await resp.aclose()
        raise UpstreamError("upstream closed the response without a body")
    return chunk


async def read_json(resp: UpstreamResponse, first: bytes, idle: float) -> dict:
    """The whole (non-streaming) body as a JSON object. Read before any byte goes to the
    client, so a broken body is a retryable failure (the next target may do better)."""
    parts = [first]
    try:
        while (chunk := await resp.next(idle)) is not None:
            parts.append(chunk)
    finally:
        await resp.aclose()
    try:
        obj = _decode(b"".join(parts))
    except msgspec.DecodeError:
        raise UpstreamError("upstream sent a body that is not valid JSON") from None
    if not isinstance(obj, dict):
        raise UpstreamError("upstream sent a JSON value that is not an object")
    return obj


def _json(data: bytes) -> dict:
    try:
        obj = _decode(data)
    except msgspec.DecodeError:
        raise UpstreamError("upstream sent invalid JSON", retryable=False) from None
    if not isinstance(obj, dict):
        raise UpstreamError("upstream sent a JSON value that is not an object", retryable=False)
    return obj


def _in_stream_error(obj: dict, secret: bytes | None) -> GatewayError | None:
    """An error object sent with status 200 (in a stream, or as the whole body); the
    channel's key (``secret``) scrubbed from it, should the upstream echo it."""
    if obj.get("error") or obj.get("object") == "error":
        data = _encode(obj)
        if secret and secret in data:
            data = data.replace(secret, b"<redacted>")
        status = 400 if b"context length" in data else 502
        return map_status(status, data)
    return None


class _Events:
    """The JSON objects of an upstream SSE stream, a list per read from the upstream (what
    arrived together leaves together: one write to the client, not one per event), until
    ``[DONE]`` (then ``done``) or EOF. An error object raises, after the objects before it
    have been handed over; the channel's key (``secret``) is scrubbed from it."""

    def __init__(self, resp: UpstreamResponse, first: bytes, idle: float, secret) -> None:
        self.resp, self.first, self.idle, self.secret = resp, first, idle, secret
        self.done = False

    async def __aiter__(self) -> AsyncIterator[list[dict]]:
        dec = SSEDecoder()
        chunk: bytes | None = self.first
        while True:
            datas = dec.feed(chunk) if chunk is not None else dec.flush()
            objs: list[dict] = []
            for _, data in datas:
                if data == b"[DONE]":
                    self.done = True
                    break
                obj = _json(data)
                err = _in_stream_error(obj, self.secret)
                if err is not None:
                    if objs:
                        yield objs
                    raise err
                objs.append(obj)
            if objs:
                yield objs
            if self.done or chunk is None:
                return
            chunk = await self.resp.next(self.idle)


# -- Anthropic out, from an OpenAI-compatible upstream ------------------------------------
def messages_once(gw: Gateway, obj: dict, rec: Record, body: dict, ch: ChannelConfig) -> Response:
    try:
        err = _in_stream_error(obj, _secret(ch))
        if err is not None:
            raise err
        msg, usage = openai_to_anthropic(
            obj,
            model=body["model"],
            stop_sequences=body.get("stop_sequences"),
            exclude_cache=ch.anthropic_messages_exclude_cache,
        )
    except GatewayError as e:
        return gw._fail(rec, e, anthropic_proto.error_bytes)
    rec.status = 200
    _reported(rec, msg["usage"])
    return Answer(_encode(msg), gw, rec, usage)


def messages_stream(
    gw: Gateway, resp: UpstreamResponse, first: bytes, rec: Record, body: dict, ch: ChannelConfig
) -> StreamingResponse:
    conv = AnthropicStream(
        model=body["model"],
        stop_sequences=body.get("stop_sequences"),
        exclude_cache=ch.anthropic_messages_exclude_cache,
    )
    secret = _secret(ch)

    async def gen() -> AsyncIterator[bytes]:
        pending = [conv.start()]  # what goes out with the next write
        try:
            events = _Events(resp, first, ch.timeouts.idle, secret)
            async for objs in events:
                for obj in objs:
                    out = conv.feed(obj)
                    if out:
                        if rec.first_byte_at is None:
                            rec.first_byte_at = time.time()
                        pending.append(out)
                if pending and not events.done:
                    yield b"".join(pending)
                    pending = []
            if not events.done and conv.finish_reason is None:
                raise UpstreamError("upstream stream ended before it finished")
            pending.append(conv.finish())
            rec.status = 200
            _reported(rec, conv.usage.to_anthropic(ch.anthropic_messages_exclude_cache))
            reply.end(conv.usage)
            yield b"".join(pending)
        except GatewayError as e:
            rec.status, rec.error_type = e.status, e.kind
            pending.append(conv.error(e))
            await _close(gw, resp, rec, conv.usage)
            yield b"".join(pending)
        except (asyncio.CancelledError, GeneratorExit):
            if rec.done_at is None:
                rec.status, rec.error_type = 499, "client_disconnected"
            raise
        finally:
            await _close(gw, resp, rec, conv.usage)

    reply = _GuardedStream(gen(), gw, resp, rec)
    return reply


def _reported(rec: Record, usage: dict) -> None:
    rec.reported_input_tokens = usage.get("input_tokens")
    rec.reported_cache_read_tokens = usage.get("cache_read_input_tokens")
    rec.reported_output_tokens = usage.get("output_tokens")


# -- Anthropic out, from an Anthropic upstream (passthrough) -----------------------------
def _anthropic_usage(u: object, usage: Usage) -> None:
    if not isinstance(u, dict):
        return
    cached = u.get("cache_read_input_tokens") or 0
    created = u.get("cache_creation_input_tokens") or 0
    if isinstance(u.get("input_tokens"), int):
        usage.prompt_tokens = u["input_tokens"] + cached + created
        usage.cached_tokens = cached
    if isinstance(u.get("output_tokens"), int):
        usage.completion_tokens = u["output_tokens"]


def anthropic_passthrough(
    gw: Gateway, resp: UpstreamResponse, first, rec: Record, public: str, upstream_model: str
) -> Response:
    """``first`` is the first body chunk of a stream, or the whole JSON object otherwise."""
    usage = Usage()
    idle = _idle_of(gw, rec)
    swap = (upstream_model.encode(), public.encode()) if upstream_model != public else None
    secret = _secret_of(gw, rec)
    if not rec.stream:
        obj = first
        _anthropic_usage(obj.get("usage"), usage)
        if swap:
            obj["model"] = public
        rec.status = 200
        return Answer(_encode(obj), gw, rec, usage)

    async def gen() -> AsyncIterator[bytes]:
        dec = SSEDecoder()
        chunk: bytes | None = first
        try:
            while chunk is not None:
                for _, data in dec.feed(chunk):
                    try:
                        obj = _decode(data)
                    except msgspec.DecodeError:
                        continue
                    if isinstance(obj, dict):
                        msg = obj.get("message")
                        _anthropic_usage(
                            (msg or {}).get("usage") if isinstance(msg, dict) else obj.get("usage"),
                            usage,
                        )
                if rec.first_byte_at is None:
                    rec.first_byte_at = time.time()
                out = chunk.replace(swap[0], swap[1]) if swap else chunk
                if secret and secret in out:  # an error event echoing the channel's key
                    out = out.replace(secret, b"<redacted>")
                chunk = await resp.next(idle)
                if chunk is None:
                    rec.status = 200
                    reply.end(usage)
                yield out
        except GatewayError as e:
            rec.status, rec.error_type = e.status, e.kind
            await _close(gw, resp, rec, usage)
            yield anthropic_proto.error_event(e)
        except (asyncio.CancelledError, GeneratorExit):
            if rec.done_at is None:
                rec.status, rec.error_type = 499, "client_disconnected"
            raise
        finally:
            await _close(gw, resp, rec, usage)

    reply = _GuardedStream(gen(), gw, resp, rec)
    return reply


# -- OpenAI out (chat completions passthrough) -------------------------------------------
def chat_once(gw: Gateway, obj: dict, rec: Record, public: str) -> Response:
    err = _in_stream_error(obj, _secret_of(gw, rec))
    if err is not None:
        return gw._fail(rec, err, openai_proto.error_bytes)
    if "model" in obj:
        obj["model"] = public
    rec.status = 200
    return Answer(_encode(obj), gw, rec, Usage.from_openai(obj.get("usage")))


def chat_stream(
    gw: Gateway, resp: UpstreamResponse, first: bytes, rec: Record, public: str, want_usage: bool
) -> StreamingResponse:
    idle = _idle_of(gw, rec)
    secret = _secret_of(gw, rec)

    async def gen() -> AsyncIterator[bytes]:
        usage = Usage()
        pending: list[bytes] = []  # what goes out with the next write
        try:
            events = _Events(resp, first, idle, secret)
            async for objs in events:
                for obj in objs:
                    if isinstance(obj.get("usage"), dict):
                        usage = Usage.from_openai(obj["usage"])
                    if not want_usage and "usage" in obj:
                        if not obj.get("choices"):
                            continue  # the usage-only chunk the client did not ask for
                        del obj["usage"]
                    if obj.get("model") not in (None, public):
                        obj["model"] = public
                    if rec.first_byte_at is None and obj.get("choices"):
                        rec.first_byte_at = time.time()
                    pending.append(b"data: " + _encode(obj) + b"\n\n")
                if pending and not events.done:
                    yield b"".join(pending)
                    pending = []
            if not events.done:
                raise UpstreamError("upstream stream ended before it finished")
            rec.status = 200
            reply.end(usage)
            pending.append(b"data: [DONE]\n\n")
            yield b"".join(pending)
        except GatewayError as e:
            rec.status, rec.error_type = e.status, e.kind
            await _close(gw, resp, rec, usage)
            pending.append(openai_proto.error_chunk(e))
            yield b"".join(pending)
        except (asyncio.CancelledError, GeneratorExit):
            if rec.done_at is None:
                rec.status, rec.error_type = 499, "client_disconnected"
            raise
        finally:
            await _close(gw, resp, rec, usage)

    reply = _GuardedStream(gen(), gw, resp, rec)
    return reply


class _GuardedStream(StreamingResponse):
    """A relay's SSE response.

    The relay calls ``end(usage)`` before it yields its last chunk: that chunk goes out
    with the end of the body in one write, and the relay's cleanup (closing the upstream,
    closing and submitting the record) runs after it, once the client has the whole
    answer, not on its clock. The upstream and the record are also closed when the client
    leaves before the body started (the generator then never runs its own cleanup) or
    during the last write."""

    def __init__(self, content, gw: Gateway, resp: UpstreamResponse, rec: Record) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self._guard = (gw, resp, rec)
        self.last = False
        self.usage: Usage | None = None

    def end(self, usage: Usage) -> None:
        self.last, self.usage = True, usage

    async def stream_response(self, send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        async for chunk in self.body_iterator:
            await send({"type": "http.response.body", "body": chunk, "more_body": not self.last})
        if not self.last:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            gw, resp, rec = self._guard
            if rec.done_at is None:
                rec.status, rec.error_type = 499, "client_disconnected"
                await _close(gw, resp, rec, self.usage or Usage())


class Answer(Response):
    """A whole JSON answer. Its record is closed and submitted after the body went out,
    off the client's clock (also when the client left meanwhile: the upstream's work and
    usage are recorded all the same)."""

    def __init__(self, body: bytes, gw: Gateway, rec: Record, usage: Usage) -> None:
        super().__init__(body, media_type="application/json")
        self._after = (gw, rec, usage)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            gw, rec, usage = self._after
            gw.finish(rec, usage)


async def _close(gw: Gateway, resp: UpstreamResponse, rec: Record, usage: Usage) -> None:
    """Close the upstream response and submit the record, once."""
    await resp.aclose()
    if rec.done_at is None:
        gw.finish(rec, usage)


def _secret_of(gw: Gateway, rec: Record) -> bytes | None:
    """The upstream key of the record's channel: never to be relayed to a client."""
    for ch in gw.config.channels:
        if ch.name == rec.channel:
            return _secret(ch)
    return None


def _secret(ch: ChannelConfig) -> bytes | None:
    key = ch.api_key()
    return key.encode() if key and len(key) >= 8 else None


def _idle_of(gw: Gateway, rec: Record) -> float:
    for ch in gw.config.channels:
        if ch.name == rec.channel:
            return ch.timeouts.idle
    return 300.0
