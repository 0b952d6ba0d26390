"""The way out: what finishing a request does, as small named steps in the order they run.

:meth:`~.exchange.Exchange.finish` runs them once per request, just before the answer's
last bytes go out, when an error is answered, or when the client left. :func:`close`
comes first (the record's status, timings and usage; the slots the request held given
back); then :data:`FINISH_STEPS`, each taking the exchange and its record, under one
guard: a failing step is logged and the ones after it skipped, and the request path never
breaks. ``pipeline.describe(FINISH_STEPS)`` prints them beside the way in
(``docs/architecture.md``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefixgate.gateway import Gateway
    from prefixgate.pipeline.exchange import Exchange
    from prefixgate.record import Record
    from prefixgate.usage import Usage


def close(x: Exchange, usage: Usage | None) -> None:
    """The record's status (``499 client_disconnected`` if it has none yet), timings and
    usage; the capture done now if still pending, the route's, the admission's and the
    channel's slots given back."""
    rec, gw = x.record, x.gateway
    gw.open_records -= 1
    if rec.status == 0:
        rec.status, rec.error_type = 499, "client_disconnected"
        rec.error_message = "the client left before the answer was complete"
    if gw.captures.pending:
        gw.captures.now(rec.request_id)
    x.live.router.release(rec.request_id)
    rec.done_at = time.time()
    rec.latency_ms = (rec.done_at - rec.received_at) * 1000.0
    if x.gate is not None:  # admission slots (admission.py)
        x.gate.give(rec.done_at - rec.received_at)
    if x.channel_gate is not None:
        x.release_channel()
    if rec.first_byte_at is not None:
        rec.ttft_ms = (rec.first_byte_at - rec.received_at) * 1000.0
    if usage is not None:
        rec.prompt_tokens = usage.prompt_tokens
        rec.cached_tokens = usage.cached_tokens
        rec.completion_tokens = usage.completion_tokens
        rec.cache_creation_tokens = usage.cache_creation_tokens


def charge(x: Exchange, rec: Record) -> None:
    """Its cost, from the prices (``spend/prices.py``)."""
    if x.live.prices is not None:
        x.live.prices.charge(rec)


def limits(x: Exchange, rec: Record) -> None:
    """The rate limiter's slot given back and its tokens counted (``ratelimit.py``), off
    the request path."""
    if x.admitted:
        gw, principal = x.gateway, x.principal
        tokens = (rec.prompt_tokens or 0) + (rec.completion_tokens or 0)
        gw.spawn(gw.limiter.done(principal.name, principal.limits, tokens))


def budgets(x: Exchange, rec: Record) -> None:
    """The budgets' hold settled with the real charge (``spend/keeper.py``)."""
    if x.hold is not None:
        x.live.budgets.settle(x.hold, rec)


def metrics(x: Exchange, rec: Record) -> None:
    """The request on ``/metrics``."""
    x.gateway.metrics.observe(rec)


def write(x: Exchange, rec: Record) -> None:
    """The record to the writer: the journal now, the store in batches (``record/writer.py``)."""
    x.gateway.recorder.submit(rec)


def ledger(x: Exchange, rec: Record) -> None:
    """The record and the request as sent to the miss ledger's worker, computed later off
    the request path (``ledger/``); the telemetry span, when on, waits for that ledger."""
    gw = x.gateway
    span = None
    if gw.telemetry is not None:
        span = gw.telemetry.exporter_of(rec, x.request.headers.get("traceparent"))
    blocks = x.target.blocks if x.target is not None else None
    if rec.diagnosis is not None:  # its ledger is kept for GET /v1/diagnostics/{id}
        span = gw.fingerprints.ledger_then(rec, span)
    if x.ledger is not None:  # fed already (settle): those waiting hear of it
        if span is not None:
            x.ledger.add_done_callback(_then(span, gw))
    else:
        gw.ledger.feed(rec, x.out, span, blocks=blocks)


FINISH_STEPS: tuple[Callable[[Exchange, Record], None], ...] = (
    charge,
    limits,
    budgets,
    metrics,
    write,
    ledger,
)


def _then(then: Callable, gw: Gateway) -> Callable[[asyncio.Future], None]:
    """A ledger future's callback that hands its ledger to ``then``."""

    def call(fut: asyncio.Future) -> None:
        try:
            then(fut.result())
        except Exception:  # whoever waits must never break the request path
            gw.log.exception("a ledger's callback failed")

    return call
