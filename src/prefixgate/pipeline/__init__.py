"""The request path: each inference endpoint is one ordered tuple of steps.

An :class:`~.exchange.Exchange` (and with it the request's record) is opened when the
request arrives; the steps of its endpoint run in their order on it; the relay's answer
goes out; then :meth:`~.exchange.Exchange.finish` closes the record, once, by the steps of
:data:`FINISH_STEPS` (the way out, :mod:`.finish`). Any step may refuse the request by
raising an error, answered in the client's protocol. ``docs/architecture.md`` lists the
tuples, both ways, as :func:`describe` prints them (a test keeps the two equal).

The steps every API shares live in :mod:`.steps` (and the relays' parts in
:mod:`.relays`); each API's own, and its endpoints' tuples, in its package under
``apis/`` (``apis/<api>/steps.py``, ``apis/<api>/endpoint.py``); the hygiene steps are
:data:`prefixgate.hygiene.STEPS`.
"""

from __future__ import annotations

from prefixgate import hygiene as _hygiene
from prefixgate.pipeline.diagnose import diagnose
from prefixgate.pipeline.exchange import Endpoint, Exchange, error_response, handler, run
from prefixgate.pipeline.finish import FINISH_STEPS, close
from prefixgate.pipeline.steps import (
    Failover,
    admit,
    authenticate,
    budget,
    capture,
    plan,
    queue,
    read,
    send,
)


def inference(decode, prepare: tuple, relay, *, diagnosed: bool = True) -> tuple:
    """The way in of an endpoint served upstream, around an API's own steps: who is
    calling and the body (``authenticate``, ``read``), the API's ``decode``, whether they
    may (``admit``, ``queue``, ``budget``), where to (``plan``); then, per target in the
    failover order, the API's ``prepare`` steps (the request as the channel gets it), the
    ``capture``, the ``send`` and, when the API answers why a cache missed (``diagnosed``),
    the ``diagnose``; last, the API's ``relay``."""
    per_target = (*prepare, capture, send, diagnose) if diagnosed else (*prepare, capture, send)
    return (authenticate, read, decode, admit, queue, budget, plan, Failover(*per_target), relay)


def answered_here(decode, answer) -> tuple:
    """The way in of an endpoint the gateway answers itself (no upstream): the same
    authentication, admission and budgets as inference, then the API's ``answer``."""
    return (authenticate, read, decode, admit, queue, budget, answer)


def describe(steps: tuple) -> str:
    """The steps as one line: ``authenticate → read → … → relay_messages → finish``; a
    failover loop's own steps in brackets, hygiene with its transforms. The way out,
    :data:`FINISH_STEPS`, as ``close → charge → … → ledger``."""
    if steps is FINISH_STEPS:
        return " → ".join(step.__name__ for step in (close, *steps))
    names = []
    for step in steps:
        if isinstance(step, Failover):
            names.append("failover[" + describe(step.steps).removesuffix(" → finish") + "]")
        elif step.__name__ == "hygiene":  # (an API's step running hygiene.STEPS)
            names.append("hygiene(" + ", ".join(s.name for s in _hygiene.STEPS) + ")")
        else:
            names.append(step.__name__)
    return " → ".join([*names, "finish"])


__all__ = [
    "FINISH_STEPS",
    "Endpoint",
    "Exchange",
    "answered_here",
    "describe",
    "error_response",
    "handler",
    "inference",
    "run",
]
