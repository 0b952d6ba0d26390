"""What a channel's upstream is sent and what its answer must look like before the client
sees a byte: the URL and headers per channel kind, the first chunk (or the whole JSON
body) read and checked, and an error sent inside a 200 recognised.

Everything here fails *before* the answer starts, so a failure is still retryable on the
next target: an HTML page from a proxy, an empty body, a stream whose first event is not
JSON or is an error."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from prefixgate.engine.client import map_status
from prefixgate.errors import GatewayError, UpstreamError
from prefixgate.sse import first_event
from prefixgate.upstream.client import UpstreamResponse, read_all

if TYPE_CHECKING:
    from prefixgate.config import ChannelConfig

_decode = msgspec.json.decode
_encode = msgspec.json.encode

# Headers of an Anthropic client passed on to an ``anthropic`` channel.
_PASS_HEADERS = ("anthropic-version", "anthropic-beta")


def bearer(ch: ChannelConfig) -> dict:
    key = ch.api_key()
    return {"authorization": f"Bearer {key}"} if key else {}


def anthropic_url(base: str) -> str:
    return base + ("/messages" if base.endswith("/v1") else "/v1/messages")


def anthropic_headers(ch: ChannelConfig, incoming) -> dict:
    headers = {h: incoming[h] for h in _PASS_HEADERS if h in incoming}
    headers.setdefault("anthropic-version", "2023-06-01")
    key = ch.api_key()
    if key:
        headers["x-api-key"] = key
    return headers


def secret_of(ch: ChannelConfig) -> bytes | None:
    """The channel's upstream key: never to be relayed to a client."""
    key = ch.api_key()
    return key.encode() if key and len(key) >= 8 else None


def stream_error(obj: dict, secret: bytes | None) -> GatewayError | None:
    """An error object sent with status 200 (in a stream, or as the whole body); the
    channel's key (``secret``) scrubbed from it, should the upstream echo it."""
    if obj.get("error") or obj.get("object") == "error":
        data = _encode(obj)
        if secret and secret in data:
            data = data.replace(secret, b"<redacted>")
        status = 400 if b"context length" in data else 502
        return map_status(status, data)
    return None


async def check_answer(resp: UpstreamResponse, ch: ChannelConfig, *, stream: bool):
    """The first body chunk of a stream, or the whole JSON object of a one-shot answer,
    checked; the response is closed on any failure."""
    try:
        ctype = (resp.headers.get("content-type") or "").lower()
        want = "text/event-stream" if stream else "json"
        if want not in ctype:
            raise UpstreamError(
                f"upstream answered with content type {ctype or 'none'!r}, not {want}"
            )
        first = await resp.next(ch.timeouts.first_byte, first=True)
        if first is None:
            raise UpstreamError("upstream closed the response without a body")
        if stream:
            _check_first_events(first, ch)
            return first
        return await _read_json(resp, first, ch.timeouts.idle)
    except BaseException:
        await resp.aclose()
        raise


def _check_first_events(chunk: bytes, ch: ChannelConfig) -> None:
    """A stream's first event, when complete in its first chunk, must be a JSON object and
    not an error. (Only the first event is decoded here; the relay decodes them all.)"""
    if ch.kind == "anthropic":
        return  # passed through as it comes; Anthropic's events carry their own types
    event = first_event(chunk)
    if event is None or event[1] == b"[DONE]":
        return
    try:
        obj = _decode(event[1])
    except msgspec.DecodeError:
        raise UpstreamError("upstream's first stream event is not JSON") from None
    if not isinstance(obj, dict):
        raise UpstreamError("upstream's first stream event is not a JSON object")
    err = stream_error(obj, secret_of(ch))
    if err is not None:
        raise err


async def _read_json(resp: UpstreamResponse, first: bytes, idle: float) -> dict:
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


async def post_for_json(transport, channel, url: str, body: bytes):
    """``POST body`` to one of the channel's upstream URLs through ``transport`` (with the
    channel's key, timeouts and TLS) and the answer's decoded JSON; raises what the
    transport raises, or :class:`msgspec.DecodeError`."""
    resp = await transport.open(
        url, body, timeouts=channel.timeouts, extra_headers=bearer(channel), tls=channel.tls
    )
    return msgspec.json.decode(await read_all(resp, channel.timeouts.idle))
