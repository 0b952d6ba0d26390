"""The steps every API's request path shares (an API's own, its decode, convert and relay,
are in its package: ``apis/<api>/steps.py``). Each takes the :class:`~.exchange.Exchange`,
does one thing, and returns ``None`` to go on (or an answer, which ends the path). Their
order per endpoint is written once, in its API's ``endpoint.py``.

A step raises a :class:`~prefixgate.errors.GatewayError` to refuse the request; the
pipeline answers it in the client's protocol. Inside :class:`Failover`, a retryable
:class:`~prefixgate.errors.UpstreamError` moves on to the next target instead.
"""

from __future__ import annotations

import msgspec

from prefixgate.auth import fresh_store_keys
from prefixgate.engine.channel import check_answer
from prefixgate.engine.client import UpstreamRejected
from prefixgate.errors import (
    AtCapacity,
    BudgetExceeded,
    ChannelBusy,
    NotFound,
    RequestTooLarge,
    UpstreamError,
)
from prefixgate.pipeline.exchange import Exchange

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
    """The decoded body on the exchange, and what the record reads of it (the model asked
    for, a stream or not, the session by ``session_of``)."""
    x.body = body
    rec = x.record
    rec.requested_model = body["model"]
    rec.stream = bool(body.get("stream"))
    rec.session_id, rec.session_kind = session_of(body, x.request.headers)


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
