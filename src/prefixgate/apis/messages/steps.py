"""The steps of ``POST /v1/messages`` that are the Anthropic Messages API's own (their
order is in ``endpoint.py``): decode, hygiene, convert, relay.

For an ``openai`` channel the request goes upstream as Chat Completions (``request.py``,
after the channel's hygiene) and the answer comes back as Anthropic's message or event
sequence (``response.py``, ``stream.py``); an ``anthropic`` channel gets the request as it
came, the model mapped, and its answer is passed through.
"""

from __future__ import annotations

import msgspec
from starlette.responses import Response

from prefixgate import hygiene as hygiene_steps
from prefixgate.apis.messages.request import ConvertOptions, convert
from prefixgate.apis.messages.response import openai_to_anthropic
from prefixgate.apis.messages.stream import AnthropicStream
from prefixgate.diagnostics.request import anthropic_ask, anthropic_params, message_id
from prefixgate.diagnostics.verdict import EXTENSION, anthropic_diagnostics
from prefixgate.engine.channel import (
    anthropic_headers,
    anthropic_url,
    bearer,
    secret_of,
    stream_error,
)
from prefixgate.errors import GatewayError
from prefixgate.identify import session_of_messages
from prefixgate.pipeline.diagnose import extension_head, extension_tail, look_up
from prefixgate.pipeline.exchange import Exchange
from prefixgate.pipeline.relays import (
    Answer,
    Converted,
    Stream,
    passthrough,
    set_reported_usage,
    settle_once,
)
from prefixgate.pipeline.steps import set_decoded
from prefixgate.protocol import anthropic as anthropic_proto
from prefixgate.protocol.messages_body import decode_messages_body
from prefixgate.usage import Usage

_encode = msgspec.json.encode


async def decode_messages(x: Exchange) -> None:
    """An Anthropic Messages request, decoded into typed structs and checked as it is;
    its ``diagnostics`` (why did my cache miss) read apart, never sent upstream."""
    turns, headers, who = x.gateway.turns, x.request.headers, getattr(x.principal, "name", None)

    def key_of(small: dict) -> tuple | None:  # the session's previous request lends
        session = session_of_messages(small, headers)[0]
        return None if session is None else (who, session)

    # a session there can be (its header, or a metadata field): else the decode alone
    maybe = bool(headers.get("x-claude-code-session-id")) or b'"metadata"' in x.raw
    lend = turns if turns.budget > 0 and maybe else None
    set_decoded(
        x, decode_messages_body(x.raw, x.live.config.limits, lend, key_of), session_of_messages
    )
    typed = x.body.typed
    if typed.diagnostics is not None:
        x.ask = anthropic_ask(typed.diagnostics)
        x.params = anthropic_params(typed)
        look_up(x)


async def hygiene(x: Exchange) -> None:
    """The channel's prefix-protecting transforms (:data:`prefixgate.hygiene.STEPS`), on
    the typed request, for an ``openai`` channel (the vendor's own API gets the request as
    it came)."""
    if x.channel.kind == "openai":
        hygienic_request(x, x.channel)


def hygienic_request(x: Exchange, ch):
    """The typed request after the channel's hygiene steps, once per channel."""
    typed = x.hygienic.get(ch.name)
    if typed is None:
        typed = x.hygienic[ch.name] = hygiene_steps.apply_typed(
            x.body.typed, ch, x.gateway.render_orders
        )
    return typed


def upstream_chat_request(x: Exchange, ch) -> dict:
    """The OpenAI chat request a channel receives for an Anthropic request, converted once
    per channel from its hygienic request (the ``prefix`` policy and the send share it)."""
    out = x.prepared.get(ch.name)
    if out is None:
        options = ConvertOptions(
            ch.upstream_model(x.body["model"]), ch.thinking, ch.history_thinking
        )
        typed, session = hygienic_request(x, ch), x.record.session_id
        if session is None:
            out = convert(typed, options)
        else:  # the session's previous turn lends the conversions of what it re-sends
            out = x.gateway.turns.convert((ch.name, session), typed, options, len(x.raw))
        x.prepared[ch.name] = out
    return out


async def convert_messages(x: Exchange) -> None:
    """Anthropic in: converted to OpenAI Chat for an ``openai`` channel (deterministic; texts
    stay raw JSON), passed through with the model mapped for an ``anthropic`` one."""
    ch, target = x.channel, x.target
    if ch.kind == "openai":
        x.out = upstream_chat_request(x, ch)
        x.url, x.headers = target.base_url + "/chat/completions", bearer(ch)
        session = x.record.session_id
        if session is not None:  # what the session's previous body sent again is copied
            x.data = x.gateway.turns.encode((ch.name, session), x.out)
            return
    else:
        x.out = {**x.body.whole(), "model": ch.upstream_model(x.body["model"])}
        x.out.pop("diagnostics", None)  # answered here, never forwarded
        x.url = anthropic_url(target.base_url)
        x.headers = anthropic_headers(ch, x.request.headers)
    x.data = _encode(x.out)


async def relay_messages(x: Exchange) -> Response | Stream:
    """Anthropic out: from an ``openai`` channel converted (a stream through the state
    machine that emits Anthropic's exact event sequence), from an ``anthropic`` one
    passed through."""
    if x.channel.kind == "anthropic":
        return anthropic_passthrough(x)
    if x.record.stream:
        return messages_stream(x)
    await settle_once(x)
    return messages_once(x)


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
    msg["id"] = message_id(rec.request_id)
    if x.verdict is not None:
        msg["diagnostics"] = anthropic_diagnostics(x.verdict)
        msg[EXTENSION] = extension_tail(x, usage)
    rec.status = 200
    set_reported_usage(rec, msg["usage"])
    return Answer(_encode(msg), x, usage)


def messages_stream(x: Exchange) -> Stream:
    ch, body, rec = x.channel, x.body, x.record
    conv = AnthropicStream(
        model=body["model"],
        stop_sequences=body.get("stop_sequences"),
        exclude_cache=ch.anthropic_messages_exclude_cache,
    )
    conv.message_id = message_id(rec.request_id)
    if x.verdict is not None:
        conv.head = {"diagnostics": anthropic_diagnostics(x.verdict), EXTENSION: extension_head(x)}
        conv.tail = lambda u: {EXTENSION: extension_tail(x, u)}
    exclude = ch.anthropic_messages_exclude_cache
    return Stream(Converted(x, conv, lambda u: set_reported_usage(rec, u.to_anthropic(exclude))))


# -- passed through: an upstream that speaks Anthropic's protocol -----------------------
def anthropic_usage(obj: dict, usage: Usage) -> None:
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
    return passthrough(x, anthropic_usage, anthropic_proto.error_event)
