"""The last step: relaying the open upstream response to the client, in the client's
protocol.

Each relay reads the upstream with the channel's idle timeout, converts (or passes
through), keeps the raw upstream usage for the record, and leaves finishing to the
exchange (:meth:`~.exchange.Exchange.finish`), which runs once the answer's last byte went
out, when it failed, or when the client went away (the upstream request is then cancelled
by closing its connection). A relay sets the record's status; one still unset at the end
means the client left.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import msgspec
from starlette.responses import Response, StreamingResponse

from prefixgate.convert.response import openai_to_anthropic
from prefixgate.convert.stream import AnthropicStream
from prefixgate.errors import GatewayError, UpstreamError
from prefixgate.pipeline.exchange import Exchange
from prefixgate.protocol import anthropic as anthropic_proto
from prefixgate.protocol import openai as openai_proto
from prefixgate.record.reason import failed
from prefixgate.sse import SSEDecoder
from prefixgate.upstream.channel import secret_of, stream_error
from prefixgate.usage import Usage

_decode = msgspec.json.decode
_encode = msgspec.json.encode
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


async def relay_messages(x: Exchange) -> Response:
    """Anthropic out: from an ``openai`` channel converted (a stream through the state
    machine that emits Anthropic's exact event sequence), from an ``anthropic`` one
    passed through."""
    if x.channel.kind == "anthropic":
        return anthropic_passthrough(x)
    if x.record.stream:
        return messages_stream(x)
    return messages_once(x)


async def relay_chat(x: Exchange) -> Response:
    """OpenAI out: the chat answer passed through, the public model name restored."""
    if x.record.stream:
        return chat_stream(x)
    return chat_once(x)


def _json(data: bytes) -> dict:
    try:
        obj = _decode(data)
    except msgspec.DecodeError:
        raise UpstreamError("upstream sent invalid JSON", retryable=False) from None
    if not isinstance(obj, dict):
        raise UpstreamError("upstream sent a JSON value that is not an object", retryable=False)
    return obj


class _Events:
    """The JSON objects of an upstream SSE stream, a list per read from the upstream (what
    arrived together leaves together: one write to the client, not one per event), until
    ``[DONE]`` (then ``done``) or EOF. An error object raises, after the objects before it
    have been handed over; the channel's key is scrubbed from it."""

    def __init__(self, x: Exchange) -> None:
        self.x = x
        self.done = False

    async def __aiter__(self) -> AsyncIterator[list[dict]]:
        x = self.x
        resp, idle, secret = x.upstream, x.channel.timeouts.idle, secret_of(x.channel)
        dec = SSEDecoder()
        chunk: bytes | None = x.first
        while True:
            datas = dec.feed(chunk) if chunk is not None else dec.flush()
            objs: list[dict] = []
            for _, data in datas:
                if data == b"[DONE]":
                    self.done = True
                    break
                obj = _json(data)
                err = stream_error(obj, secret)
                if err is not None:
                    if objs:
                        yield objs
                    raise err
                objs.append(obj)
            if objs:
                yield objs
            if self.done or chunk is None:
                return
            chunk = await resp.next(idle)


# -- Anthropic out, from an OpenAI-compatible upstream ------------------------------------
def messages_once(x: Exchange) -> Response:
    ch, body, rec = x.channel, x.body, x.record
    try:
        err = stream_error(x.first, secret_of(ch))
        if err is not None:
            raise err
        msg, usage = openai_to_anthropic(
            x.first,
            model=body["model"],
            stop_sequences=body.get("stop_sequences"),
            exclude_cache=ch.anthropic_messages_exclude_cache,
        )
    except GatewayError as e:
        return x.fail(e)
    rec.status = 200
    _reported(rec, msg["usage"])
    return Answer(_encode(msg), x, usage)


def messages_stream(x: Exchange) -> StreamingResponse:
    ch, body, rec = x.channel, x.body, x.record
    conv = AnthropicStream(
        model=body["model"],
        stop_sequences=body.get("stop_sequences"),
        exclude_cache=ch.anthropic_messages_exclude_cache,
    )
    exclude = ch.anthropic_messages_exclude_cache
    return converted_stream(x, conv, lambda u: _reported(rec, u.to_anthropic(exclude)))


def converted_stream(x: Exchange, conv, report: Callable[[Usage], None]) -> StreamingResponse:
    """A chat stream relayed through a converting state machine (``start``, ``feed``,
    ``finish``, ``error``; its ``usage`` and ``finish_reason``); ``report`` records the
    usage the client was shown."""
    rec = x.record

    async def gen() -> AsyncIterator[bytes]:
        pending = [conv.start()]  # what goes out with the next write
        try:
            events = _Events(x)
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
            report(conv.usage)
            reply.end(conv.usage)
            yield b"".join(pending)
        except GatewayError as e:
            failed(rec, e)
            pending.append(conv.error(e))
            await x.close(conv.usage)
            yield b"".join(pending)
        finally:
            await x.close(conv.usage)

    reply = Stream(gen(), x)
    return reply


def _reported(rec, usage: dict) -> None:
    rec.reported_input_tokens = usage.get("input_tokens")
    rec.reported_cache_read_tokens = usage.get("cache_read_input_tokens")
    rec.reported_output_tokens = usage.get("output_tokens")


# -- passed through: an upstream that speaks the client's protocol ----------------------
def _anthropic_usage(obj: dict, usage: Usage) -> None:
    """Usage from an Anthropic answer or stream event (``message_start`` holds it in its
    message, ``message_delta`` at the top)."""
    msg = obj.get("message")
    u = msg.get("usage") if isinstance(msg, dict) else obj.get("usage")
    if not isinstance(u, dict):
        return
    cached = u.get("cache_read_input_tokens") or 0
    created = u.get("cache_creation_input_tokens") or 0
    if isinstance(u.get("input_tokens"), int):
        usage.prompt_tokens = u["input_tokens"] + cached + created
        usage.cached_tokens = cached
        usage.cache_creation_tokens = created
    if isinstance(u.get("output_tokens"), int):
        usage.completion_tokens = u["output_tokens"]


def anthropic_passthrough(x: Exchange) -> Response:
    return passthrough(x, _anthropic_usage, anthropic_proto.error_event)


def passthrough(
    x: Exchange, usage_of: Callable[[dict, Usage], None], error_event: Callable[..., bytes]
) -> Response:
    """The upstream's answer as it came, the public model name restored; ``usage_of``
    reads the usage of the whole answer or of each stream event into the record's.
    ``x.first`` is the first body chunk of a stream, or the whole JSON object otherwise."""
    rec, public, ch = x.record, x.body["model"], x.channel
    upstream_model = x.out["model"]
    usage = Usage()
    swap = (upstream_model.encode(), public.encode()) if upstream_model != public else None
    secret = secret_of(ch)
    if not rec.stream:
        obj = x.first
        usage_of(obj, usage)
        if swap:
            obj["model"] = public
        rec.status = 200
        return Answer(_encode(obj), x, usage)

    async def gen() -> AsyncIterator[bytes]:
        dec = SSEDecoder()
        chunk: bytes | None = x.first
        idle = ch.timeouts.idle
        try:
            while chunk is not None:
                for _, data in dec.feed(chunk):
                    try:
                        obj = _decode(data)
                    except msgspec.DecodeError:
                        continue
                    if isinstance(obj, dict):
                        usage_of(obj, usage)
                if rec.first_byte_at is None:
                    rec.first_byte_at = time.time()
                out = chunk.replace(swap[0], swap[1]) if swap else chunk
                if secret and out.find(secret) >= 0:  # an error event echoing the channel's key
                    out = out.replace(secret, b"<redacted>")
                chunk = await x.upstream.next(idle)
                if chunk is None:
                    rec.status = 200
                    reply.end(usage)
                yield out
        except GatewayError as e:
            failed(rec, e)
            await x.close(usage)
            yield error_event(e)
        finally:
            await x.close(usage)

    reply = Stream(gen(), x)
    return reply


# -- OpenAI out (chat completions passthrough) -------------------------------------------
def chat_once(x: Exchange) -> Response:
    obj, rec = x.first, x.record
    err = stream_error(obj, secret_of(x.channel))
    if err is not None:
        return x.fail(err)
    if "model" in obj:
        obj["model"] = x.body["model"]
    rec.status = 200
    return Answer(_encode(obj), x, Usage.from_openai(obj.get("usage")))


def chat_stream(x: Exchange) -> StreamingResponse:
    rec, public = x.record, x.body["model"]
    want_usage = bool((x.body.get("stream_options") or {}).get("include_usage"))

    async def gen() -> AsyncIterator[bytes]:
        usage = Usage()
        pending: list[bytes] = []  # what goes out with the next write
        try:
            events = _Events(x)
            async for objs in events:
                for obj in objs:
                    if "usage" in obj:
                        if isinstance(obj["usage"], dict):
                            usage = Usage.from_openai(obj["usage"])
                        if not want_usage:
                            if not obj.get("choices"):
                                continue  # the usage-only chunk the client did not ask for
                            del obj["usage"]
                    if obj.get("model") not in (None, public):
                        obj["model"] = public
                    if rec.first_byte_at is None and obj.get("choices"):
                        rec.first_byte_at = time.time()
                    pending += (b"data: ", _encode(obj), b"\n\n")
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
            failed(rec, e)
            await x.close(usage)
            pending.append(openai_proto.error_chunk(e))
            yield b"".join(pending)
        finally:
            await x.close(usage)

    reply = Stream(gen(), x)
    return reply


class Stream(StreamingResponse):
    """A relay's SSE response.

    The relay calls ``end(usage)`` before it yields its last chunk: the record is finished
    (journaled) then, and that chunk goes out with the end of the body in one write; closing
    the upstream runs after it. The exchange is also closed when the client leaves before
    the body started (the generator then never runs its own cleanup) or mid-stream."""

    def __init__(self, content, x: Exchange) -> None:
        super().__init__(
            content, media_type="text/event-stream", headers={**SSE_HEADERS, **x.id_headers()}
        )
        self.x = x
        self.last = False
        self.usage: Usage | None = None

    def end(self, usage: Usage) -> None:
        """The answer is whole: finish the record now, before its last chunk goes out,
        so that a client holding the whole answer implies a journaled record."""
        self.last, self.usage = True, usage
        self.x.finish(usage)

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
            await self.x.close(self.usage or Usage())


class Answer(Response):
    """A whole JSON answer. Its record is finished (journaled) just before the body goes
    out, so a client that has the answer implies a record that survives a crash; the
    upstream's work and usage are recorded even if the client left meanwhile."""

    def __init__(self, body: bytes, x: Exchange, usage: Usage) -> None:
        super().__init__(body, media_type="application/json", headers=x.id_headers())
        self.x, self.usage = x, usage

    async def __call__(self, scope, receive, send) -> None:
        self.x.finish(self.usage)
        await super().__call__(scope, receive, send)
