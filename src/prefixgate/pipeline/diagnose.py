"""The ``diagnose`` step and what the relays add to an answer when the client asked why
its cache missed (``diagnostics/``; ``docs/diagnostics.md``).

The earlier request is looked up (memory, else the store) from the moment the request is
decoded (:func:`look_up`). The step runs inside the failover loop after the send, once
the upstream has begun to answer (the request's segments were computed meanwhile, while
the upstream worked), and before the relay writes the answer's first byte: it compares
and leaves the
:class:`~prefixgate.diagnostics.verdict.Verdict` on the exchange; the relay puts the
standard object and the extension's structural part at the start of the answer, and the
engine's figures at its end. A request that did not ask costs one attribute test.
"""

from __future__ import annotations

import asyncio

from prefixgate.apis import API_OF
from prefixgate.diagnostics import verdict as vd
from prefixgate.diagnostics.lookup import LookupFailed
from prefixgate.diagnostics.request import request_id_of
from prefixgate.hygiene import keeps_system_in_place
from prefixgate.pipeline.exchange import Exchange
from prefixgate.record.record import Diagnosis
from prefixgate.usage import Usage


def look_up(x: Exchange) -> None:
    """Start looking the earlier request up as soon as the request is decoded (a store
    read, when another worker served it, overlaps the rest of the request's way)."""
    ask = x.ask
    if ask is not None and ask.previous is not None and x.prev is None:
        x.prev = asyncio.ensure_future(_find(x.gateway.fingerprints, ask.previous))


async def _find(fingerprints, previous: str) -> tuple[tuple, bool]:
    try:
        return await fingerprints.find(previous), False
    except LookupFailed:
        return (None, None), True


async def diagnose(x: Exchange) -> None:
    """Compare the request with the earlier one its client named (its segments are known
    by now: the capture ran while the upstream worked); keep it for the next."""
    ask = x.ask
    if ask is None:
        return
    gw, rec, ch = x.gateway, x.record, x.channel
    api = API_OF[rec.endpoint]
    if api.native(ch):
        # The upstream speaks the client's protocol and answers with its own ids: the
        # Responses field is its to answer; Anthropic's ``diagnostics`` is not forwarded.
        x.verdict = None
        return
    captures = gw.captures
    if captures.pending:
        captures.now(rec.request_id)
    if rec.segments_in is None:  # no capture configured: segments for this comparison only
        captures.for_diagnostics(rec, x.body, x.out, ch, x.principal, x.raw, x.data)
    (prev, where), failed = await x.prev if x.prev is not None else ((None, None), False)
    if ask.previous is None:
        verdict = vd.Verdict(vd.NONE)
    elif failed:
        verdict = vd.Verdict(vd.UNAVAILABLE)
    else:
        rendering = gw.render_orders.rendering_of(ch)
        verdict = vd.judge(
            prev,
            rec,
            x.params,
            api=api.diagnostics,
            tools_first=rendering.tools == "tools_first",
            # the template moves later system messages to the head, unless the channel
            # delivers them inside the turns (hygiene/system_in_place.py)
            hoists_system=rendering.hoists_system
            and not keeps_system_in_place(ch, gw.render_orders),
            found_in=where,
        )
    x.verdict = verdict
    at = verdict.at
    rec.diagnosis = Diagnosis(
        params=x.params,
        previous=request_id_of(ask.previous) if ask.previous else None,
        answer=verdict.answer if ask.previous is not None else None,
        missed_tokens=verdict.missed,
        segment=at.segment if at is not None else None,
        found_in=where,
    )
    gw.fingerprints.keep(rec)


def extension_head(x: Exchange) -> dict:
    """The extension's structural part, for the start of the answer."""
    v = x.verdict
    return vd.extension(v, x.record, x.ask.previous)


def extension_tail(x: Exchange, usage: Usage) -> dict:
    """The extension at the end of the answer: the structural part, the engine's figures
    and the miss ledger (computed by :meth:`Exchange.settle` before the end; left out
    when there is none, or it was not ready in time)."""
    out = {
        **extension_head(x),
        "engine": vd.engine_truth(usage.prompt_tokens, usage.cached_tokens),
    }
    fut = x.ledger
    ledger = fut.result() if fut is not None and fut.done() else None
    if ledger is not None:
        out["ledger"] = ledger.as_dict()
    return out
