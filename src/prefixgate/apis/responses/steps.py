"""The steps of ``POST /v1/responses`` (and ``POST /v1/responses/compact``) that are the
Responses API's own (their order is in ``endpoint.py``): decode, convert, relay.

For a channel with ``responses_api: convert`` (the default: any OpenAI-compatible server)
the request goes upstream as Chat Completions (``request.py``) and the
answer comes back as Responses events (``stream.py``); with
``responses_api: passthrough`` the upstream's own ``/responses`` gets the request as it
came, the model mapped. Nothing is stored between requests: Codex sends ``store: false``
and its whole conversation each turn.
"""

from __future__ import annotations

import msgspec
from starlette.responses import Response

from prefixgate import hygiene
from prefixgate.apis.messages.request import ConvertOptions
from prefixgate.apis.responses.request import convert, convert_lent, tool_map
from prefixgate.apis.responses.response import chat_to_response, response_base
from prefixgate.apis.responses.stream import ResponsesStream
from prefixgate.diagnostics.request import (
    echoed_options,
    response_id,
    responses_ask,
    responses_params,
)
from prefixgate.diagnostics.verdict import EXTENSION, openai_diagnostics
from prefixgate.engine.channel import bearer, secret_of, stream_error
from prefixgate.errors import GatewayError, InvalidRequest
from prefixgate.identify import session_of_responses
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
from prefixgate.protocol import openai as openai_proto
from prefixgate.protocol.responses import TRIGGER, Item, decode_responses_body
from prefixgate.usage import Usage

_encode = msgspec.json.encode


async def decode_responses(x: Exchange) -> None:
    """A Responses request, decoded into typed structs (texts raw) and checked as it is:
    what a stateless gateway cannot serve is refused here, before anything is sent. The
    session's previous request lends the input items it checked (the same bytes)."""
    turns, headers, who = x.gateway.turns, x.request.headers, getattr(x.principal, "name", None)

    def key_of(small: dict) -> tuple | None:
        session = session_of_responses(small, headers)[0]
        return None if session is None else ("responses", who, session)

    # a session there can be (one of its headers, or a body field it is read from): else
    # the decode alone, without a first read of the top level that would find none
    maybe = (
        any(headers.get(h) for h in ("session-id", "x-session-affinity", "x-session-id"))
        or b'"prompt_cache_key"' in x.raw
        or b'"user"' in x.raw
    )
    lend = turns if turns.budget > 0 and maybe else None
    set_decoded(
        x, decode_responses_body(x.raw, x.live.config.limits, lend, key_of), session_of_responses
    )
    typed = x.body.typed
    if typed.prompt_cache_options is not None:
        x.ask = responses_ask(typed.prompt_cache_options)
        if x.ask is not None:
            x.params = responses_params(typed)
            look_up(x)


async def decode_compact(x: Exchange) -> None:
    """A compaction asked for by ``POST /v1/responses/compact`` (the conversation in
    ``input``): served as a Responses request whose input ends with a
    ``compaction_trigger``, answered whole (``apis/responses/compaction.py``)."""
    set_decoded(x, decode_responses_body(x.raw, x.live.config.limits), session_of_responses)
    typed = x.body.typed
    items = typed.input
    if type(items) is str:
        items = [Item(role="user", content=items)]
    if items[-1].type != TRIGGER:
        items.append(Item(type=TRIGGER))
    typed.input, typed.stream = items, None
    x.body.compacting = True
    x.record.stream = False


def upstream_chat_of_responses(x: Exchange, ch) -> dict:
    """The Chat request a channel receives for a Responses request, made once per channel
    (the ``prefix`` routing policy and the send share it)."""
    out = x.prepared.get(ch.name)
    if out is None:
        options = ConvertOptions(
            ch.upstream_model(x.body["model"]), ch.thinking, ch.history_thinking
        )
        session = x.record.session_id
        if session is None:
            out = convert(x.body.typed, options)
        else:  # the session's previous turn lends the conversions of what it re-sends
            key = _turns_key(ch, session)
            out = convert_lent(x.gateway.turns, key, x.body.typed, options, len(x.raw))
        moved = hygiene.apply_chat(out["messages"], ch, x.gateway.render_orders)
        if moved is not None:  # later system/developer items delivered in the turns
            out = {**out, "messages": moved}
        x.prepared[ch.name] = out
    return out


async def convert_responses(x: Exchange) -> None:
    """Responses in: to Chat Completions (deterministic; texts stay raw JSON), or passed
    through with the model mapped to an upstream that serves ``/responses`` itself. An
    image for a channel whose model takes none is refused (400), not sent."""
    ch, target = x.channel, x.target
    if x.body.images and not ch.accepts_images:
        raise InvalidRequest(
            f"input holds an image, and the model {x.body['model']!r} takes text only"
        )
    if ch.responses_api == "passthrough":
        x.out = {**x.body.whole(), "model": ch.upstream_model(x.body["model"])}
        compact = x.endpoint.steps[-1] is relay_compact
        x.url = target.base_url + ("/responses/compact" if compact else "/responses")
    else:
        x.out = upstream_chat_of_responses(x, ch)
        x.url = target.base_url + "/chat/completions"
    x.headers = bearer(ch)
    session = x.record.session_id
    if session is not None and ch.responses_api != "passthrough":
        # what the session's previous body sent again is copied from it
        x.data = x.gateway.turns.encode(_turns_key(ch, session), x.out)
    else:
        x.data = _encode(x.out)


def _turns_key(ch, session: str) -> tuple:
    """A Responses session's key in the gateway's ``SessionTurns`` (apart from a Messages
    session's of the same id)."""
    return ("responses", ch.name, session)


async def relay_responses(x: Exchange) -> Response | Stream:
    """Responses out: from a Chat upstream converted (a stream through the state machine
    that emits the Responses event sequence), from a Responses upstream passed through."""
    if x.channel.responses_api == "passthrough":
        return passthrough(x, _responses_usage, _failed_event)
    if x.record.stream:
        return responses_stream(x)
    await settle_once(x)
    return responses_once(x)


async def relay_compact(x: Exchange) -> Response | Stream:
    """The ``response.compaction`` object: the conversation's user messages as they came,
    then one ``compaction`` item holding the engine's summary, and the engine's usage."""
    if x.channel.responses_api == "passthrough":  # the upstream compacts itself
        return passthrough(x, _responses_usage, _failed_event)
    rec = x.record
    try:
        resp, usage = _whole(x)
    except GatewayError as e:
        return x.fail(e)
    given = x.body.plain().get("input")
    if isinstance(given, str):
        given = [{"role": "user", "content": given}]
    kept = [
        {"type": "message", **i}
        for i in given
        if i.get("type", "message") == "message" and i.get("role") == "user"
    ]
    body = {
        "id": response_id(rec.request_id),
        "object": "response.compaction",
        "created_at": resp["created_at"],
        "output": [*kept, *resp["output"]],
        "usage": resp["usage"],
    }
    rec.status = 200
    _reported_responses(rec, body["usage"])
    return Answer(_encode(body), x, usage)


def _reported_responses(rec, usage: dict) -> None:
    details = usage.get("input_tokens_details") or {}
    set_reported_usage(
        rec,
        {
            "input_tokens": usage.get("input_tokens"),
            "cache_read_input_tokens": details.get("cached_tokens"),
            "output_tokens": usage.get("output_tokens"),
        },
    )


def _whole(x: Exchange) -> tuple[dict, Usage]:
    """The upstream's whole chat answer as a Responses answer (its error raised)."""
    err = stream_error(x.first, secret_of(x.channel))
    if err is not None:
        raise err
    return chat_to_response(x.first, x.body)


def responses_once(x: Exchange) -> Response:
    rec = x.record
    try:
        resp, usage = _whole(x)
    except GatewayError as e:
        return x.fail(e)
    resp.update(_named(x))
    if x.verdict is not None:
        resp[EXTENSION] = extension_tail(x, usage)
    rec.status = 200
    _reported_responses(rec, resp["usage"])
    return Answer(_encode(resp), x, usage)


def responses_stream(x: Exchange) -> Stream:
    rec = x.record
    conv = ResponsesStream(
        {**response_base(x.body), **_named(x)},
        tool_map(x.body.typed),
        compacting=x.body.compacting,
    )
    if x.verdict is not None:
        conv.base[EXTENSION] = extension_head(x)
        conv.tail = lambda u: {EXTENSION: extension_tail(x, u)}
    return Stream(Converted(x, conv, lambda u: _reported_responses(rec, u.to_responses())))


def _named(x: Exchange) -> dict:
    """The response's id (its record's, so that a later request can name it) and, when
    the client asked, the diagnostics and the options echoed."""
    out: dict = {"id": response_id(x.record.request_id)}
    if x.verdict is not None:
        # null on a first turn (nothing named to compare with), as when nothing is asked
        first = x.ask.previous is None
        out["prompt_cache_diagnostics"] = None if first else openai_diagnostics(x.verdict)
        out["prompt_cache_options"] = echoed_options(x.ask.options)
    return out


# -- passed through ---------------------------------------------------------------------
def _responses_usage(obj: dict, usage: Usage) -> None:
    """Usage from a whole Responses answer, or from the stream event that ends one."""
    if obj.get("object") == "response":
        u = obj.get("usage")
    else:
        resp = obj.get("response")
        u = resp.get("usage") if isinstance(resp, dict) else None
    if isinstance(u, dict):
        new = Usage.from_responses(u)
        usage.prompt_tokens, usage.cached_tokens = new.prompt_tokens, new.cached_tokens
        usage.completion_tokens, usage.reasoning_tokens = (
            new.completion_tokens,
            new.reasoning_tokens,
        )


def _failed_event(err: GatewayError) -> bytes:
    """A failure after a passed-through stream started, as Responses says it."""
    body = openai_proto.error_body(err)["error"]
    data = {
        "type": "response.failed",
        "response": {
            "object": "response",
            "status": "failed",
            "error": {"code": body["code"] or body["type"], "message": body["message"]},
        },
    }
    return b"event: response.failed\ndata: " + _encode(data) + b"\n\n"
