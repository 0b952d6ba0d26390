"""The steps of the request path. Each takes the :class:`~.exchange.Exchange`, does one
thing, and returns ``None`` to go on (or an answer, which ends the path). Their order per
endpoint is written once, in :mod:`prefixgate.pipeline`.

A step raises a :class:`~prefixgate.errors.GatewayError` to refuse the request; the
pipeline answers it in the client's protocol. Inside :class:`Failover`, a retryable
:class:`~prefixgate.errors.UpstreamError` moves on to the next target instead.
"""

from __future__ import annotations

import msgspec

from prefixgate import hygiene as hygiene_steps
from prefixgate.apis.messages.request import ConvertOptions, convert
from prefixgate.auth import fresh_store_keys
from prefixgate.diagnostics.request import anthropic_ask, anthropic_params, chat_ask
from prefixgate.engine.channel import anthropic_headers, anthropic_url, bearer, check_answer
from prefixgate.engine.client import UpstreamRejected
from prefixgate.errors import (
    AtCapacity,
    BudgetExceeded,
    ChannelBusy,
    NotFound,
    RequestTooLarge,
    UpstreamError,
)
from prefixgate.identify import session_of_chat, session_of_messages
from prefixgate.pipeline.diagnose import look_up
from prefixgate.pipeline.exchange import Exchange
from prefixgate.protocol import openai as openai_proto
from prefixgate.protocol.messages_body import decode_messages_body

_encode = msgspec.json.encode


# -- before the upstream: who, what, may they, where -----------------------------------------
async def authenticate(x: Exchange) -> None:
    """The key (``x-api-key`` or ``Authorization: Bearer``), looked up by its digest
    (after the store's keys are read again if another worker changed them)."""
    epoch = x.gateway.key_epoch
    if epoch is not None and epoch.moved():
        await fresh_store_keys(x.gateway)
    x.principal = x.live.auth.authenticate(x.request.headers)
    x.record.key_name, x.record.key_owner = x.principal.name, x.principal.owner


async def read(x: Exchange) -> None:
    """The body, refused past ``limits.max_body_bytes`` (declared or streamed)."""
    x.raw = await read_body(x.request, x.live.config.limits.max_body_bytes)


async def read_body(request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(f"request body is {declared} bytes; the limit is {limit} bytes")
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(f"request body exceeds the limit of {limit} bytes")
        if chunk:  # (Starlette ends the stream with an empty one)
            parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)  # one piece: not copied


def set_decoded(x: Exchange, body, session_of) -> None:
    x.body = body
    rec = x.record
    rec.requested_model = body["model"]
    rec.stream = bool(body.get("stream"))
    rec.session_id, rec.session_kind = session_of(body, x.request.headers)


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


async def decode_chat(x: Exchange) -> None:
    """An OpenAI chat request: decoded but for ``messages`` and ``tools``, then checked."""
    limits = x.live.config.limits
    body = openai_proto.decode_chat_body(x.raw, limits)
    openai_proto.check_chat_request(body, limits)
    set_decoded(x, body, session_of_chat)
    x.ask = chat_ask(x.request.headers)
    look_up(x)


async def admit(x: Exchange) -> None:
    """The key may use the model, and is within its rate and concurrency limits (429 with
    ``retry-after`` when over)."""
    gw, principal = x.gateway, x.principal
    x.live.auth.authorize_model(principal, x.body["model"])
    if principal.limits.any:
        await gw.limiter.admit(principal.name, principal.limits)
        x.admitted = True


async def queue(x: Exchange) -> None:
    """A slot among the requests this worker carries (``server.max_in_flight``), after a
    wait in a bounded queue when all are taken; past it, or while the event loop runs too
    late to take more (``server.shed_loop_lag``), the protocol's overloaded answer
    (529 on ``/v1/messages``, 503 on OpenAI's routes) with ``retry-after``, before any
    upstream work (``admission.py``)."""
    admission = x.gateway.admission
    shed = admission.shed
    if shed is not None and shed.active:  # the loop runs late: its CPU is spent
        err = shed.refuse()
        err.status = x.endpoint.overloaded_status
        raise err
    gate = admission.worker
    if not gate.try_take():
        await _wait_for(x, gate)
    x.gate = gate


async def _wait_for(x: Exchange, gate) -> None:
    try:
        await gate.take()
    except AtCapacity as err:
        err.status = x.endpoint.overloaded_status
        raise


async def budget(x: Exchange) -> None:
    """The key's and its owner's budgets (tokens or money per day, week or month) have room:
    the request's estimate is held on each until it is settled with its real usage in
    ``finish``; 429 when one is spent. Every answer says what is left."""
    keeper = x.live.budgets
    if keeper is not None:
        try:
            x.hold, x.reply_headers = await keeper.reserve(
                x.record.request_id, x.principal, len(x.raw), x.body, x.body["model"]
            )
        except BudgetExceeded:
            x.reply_headers = {"x-should-retry": "false"}  # until the window renews
            raise


async def plan(x: Exchange) -> None:
    """The failover order: channels serving the model by priority, a replica within each
    by the channel's policy (the ``prefix`` policy asks for the prompt a channel would
    receive: ``Endpoint.prompt``, prepared once per channel and reused by the send)."""
    model = x.body["model"]
    x.targets = await x.live.router.plan(
        model,
        x.record.session_id,
        kinds=x.endpoint.kinds,
        prompt=lambda ch: x.endpoint.prompt(x, ch),
    )
    if not x.targets:
        raise NotFound(f"model {model!r} is not served here")


# -- per target, inside the failover loop ------------------------------------------------------
class Failover:
    """Run ``steps`` for each target in the failover order until one gets an answer
    started; a retryable failure before the first byte moves on to the next target (the
    replica's health hears of it), any other error ends the request."""

    def __init__(self, *steps) -> None:
        self.steps = steps
        self.__name__ = "failover"

    async def __call__(self, x: Exchange) -> None:
        last: UpstreamError | None = None
        for target in x.targets:
            x.target = target
            try:
                for step in self.steps:
                    await step(x)
                return None
            except UpstreamError as err:
                x.upstream = None  # closed by the step that failed
                x.live.router.release(x.record.request_id)
                x.release_channel()
                if not err.retryable:
                    raise
                if not isinstance(err, ChannelBusy):  # a full channel is not a failure
                    _failed(x, target, err)
                    x.record.retries += 1
                last = err
        raise last or NotFound(f"no channel serves model {x.body['model']!r}")


def _failed(x: Exchange, target, err: UpstreamError) -> None:
    """A retryable failure of one target: its health hears of it, the log says so (once
    per interval per replica, with the count of the others). An upstream's own internal
    error (500 …, not 502-504) may be the request's doing: it ejects the replica only when
    a second request's content failed there too (``report_failure``)."""
    gw, status = x.gateway, err.upstream_status
    own = status is not None and status >= 500 and status not in (502, 503, 504)
    gw.router.report_failure(target, x.raw if own else None)
    gw.failures.warning(
        (target.name, target.base_url),
        "channel %s (%s) failed: %s",
        target.name,
        target.base_url,
        err.message,
    )


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
    else:
        x.out = {**x.body.whole(), "model": ch.upstream_model(x.body["model"])}
        x.out.pop("diagnostics", None)  # answered here, never forwarded
        x.url = anthropic_url(target.base_url)
        x.headers = anthropic_headers(ch, x.request.headers)
    x.data = _encode(x.out)


async def convert_chat(x: Exchange) -> None:
    """OpenAI in: passed through with the model mapped and the channel's Chat hygiene; a
    stream always asks for usage (hidden again from a client that did not ask for it)."""
    ch, body = x.channel, x.body
    out = {**body, "model": ch.upstream_model(body["model"])}
    moved = hygiene_steps.apply_chat(body["messages"], ch, x.gateway.render_orders)
    if moved is not None:  # later system messages delivered in the turns (docs/rendering.md)
        out["messages"] = moved
    if x.record.stream:
        out["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    x.out = out
    x.url, x.headers = x.target.base_url + "/chat/completions", bearer(ch)
    x.data = _encode(out)


async def capture(x: Exchange) -> None:
    """Segment hashes of the request as received and as sent (when the store captures),
    scheduled for the loop's next turn: they are computed while the upstream works."""
    captures = x.gateway.captures
    if captures.capture is not None:
        captures.soon(x.record, x.body, x.out, x.channel, x.principal, x.raw, x.data)


async def send(x: Exchange) -> None:
    """Send upstream and wait for the first body bytes (the whole body when not
    streaming), so that an upstream that fails before any content can be failed over."""
    gw, target, rec, ch = x.gateway, x.target, x.record, x.channel
    gate = gw.admission.channels.get(ch.name)
    if gate is not None:  # the channel's own cap: spill over to the next target, or wait
        if not gate.try_take():
            if target is not x.targets[-1]:
                raise ChannelBusy(f"channel {ch.name} is at capacity")
            await _wait_for(x, gate)
        x.channel_gate = gate
    rec.channel, rec.replica, rec.upstream_model = ch.name, target.base_url, x.out["model"]
    rec.route_source = target.source
    x.live.router.acquire(target, rec.request_id)  # in flight until finish()
    options = {"timeouts": ch.timeouts, "extra_headers": x.headers, "tls": ch.tls}
    # The prompt fits; only max_tokens pushed it over the window: clamp and resend. At
    # most twice: SGLang first says max_tokens alone exceeds the window (the prompt not
    # counted), then, clamped to the window, that prompt + max_tokens does.
    for clamps in range(3):
        try:
            resp = await gw.upstream.open(x.url, x.data, channel=ch.name, **options)
            break
        except UpstreamRejected as err:
            room = err.overflow.max_tokens_room if err.overflow is not None else 0
            if clamps == 2 or not (0 < room < x.out.get("max_tokens", 0)):
                raise
            x.out = {**x.out, "max_tokens": room}
            x.data = _encode(x.out)
    x.upstream = resp
    x.first = await check_answer(resp, ch, stream=rec.stream)
    x.live.router.report_success(target)
