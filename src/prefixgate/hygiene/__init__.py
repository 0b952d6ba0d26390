"""Prompt-prefix transforms that keep upstream prefix caches valid.

Each transform is a small named step (:class:`HygieneStep`) that says which channels it
applies to; :data:`STEPS` is their order. The pipeline runs them on the typed Anthropic
request before it is converted for an ``openai`` channel (``apis/messages/steps.py``'s ``hygiene``), and
``count_tokens`` runs them on the plain request, so a count matches what is sent. The Chat
and Responses paths run :func:`apply_chat` on the Chat conversation they send. They
never touch the request as received (the record keeps that): they return a new one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from prefixgate.hygiene.billing import strip_billing_header, strip_billing_header_typed
from prefixgate.hygiene.system_in_place import (
    system_in_place,
    system_in_place_chat,
    system_in_place_typed,
)

if TYPE_CHECKING:
    from prefixgate.config import ChannelConfig
    from prefixgate.engine.order import RenderOrders
    from prefixgate.protocol.messages_body import Request


@dataclass(frozen=True, slots=True)
class HygieneStep:
    """One transform: on the typed request (the gateway's path) and on a plain dict
    (``count_tokens``); each returns ``(request, changed)``. ``applies`` is asked with the
    channel and what the gateway learned of its chat template (:mod:`prefixgate.engine.order`)."""

    name: str
    applies: Callable[[ChannelConfig, RenderOrders], bool]
    typed: Callable[[Request], tuple[Request, bool]]
    plain: Callable[[dict], tuple[dict, bool]]


BILLING_HEADER = HygieneStep(
    name="strip_billing_header",
    applies=lambda ch, orders: ch.strip_billing_header,
    typed=strip_billing_header_typed,
    plain=strip_billing_header,
)


def keeps_system_in_place(ch: ChannelConfig, orders: RenderOrders) -> bool:
    """``system_in_place: true``, or ``auto`` (the default) where the upstream's template
    was seen (``orders``) to move later system messages to the head."""
    if ch.kind != "openai" or ch.system_in_place is False:
        return False
    if ch.system_in_place is True:
        return True
    return orders.rendering_of(ch).hoists_system


SYSTEM_IN_PLACE = HygieneStep(
    name="system_in_place",
    applies=keeps_system_in_place,
    typed=system_in_place_typed,
    plain=system_in_place,
)

STEPS: tuple[HygieneStep, ...] = (BILLING_HEADER, SYSTEM_IN_PLACE)


def apply_typed(req: Request, ch: ChannelConfig, orders: RenderOrders) -> Request:
    """``req`` after every step that applies to the channel, in order."""
    for step in STEPS:
        if step.applies(ch, orders):
            req, _ = step.typed(req)
    return req


def apply_chat(messages, ch: ChannelConfig, orders: RenderOrders) -> list | None:
    """An OpenAI Chat conversation (a list, or its raw JSON) after the steps that apply to
    one (``system_in_place``: later system and developer messages delivered in the
    client's turns; the billing header is Claude Code's, which speaks Messages); None when
    nothing changes, so that the request is sent as it came, byte for byte."""
    if not keeps_system_in_place(ch, orders):
        return None
    if type(messages) is msgspec.Raw:
        messages = msgspec.json.decode(messages)
    if not isinstance(messages, list):
        return None
    out, changed = system_in_place_chat(messages)
    return out if changed else None


def apply_plain(body: dict, ch: ChannelConfig, orders: RenderOrders) -> dict:
    """``apply_typed`` for a plain request."""
    for step in STEPS:
        if step.applies(ch, orders):
            body, _ = step.plain(body)
    return body


__all__ = [
    "STEPS",
    "HygieneStep",
    "apply_chat",
    "apply_plain",
    "apply_typed",
    "keeps_system_in_place",
    "strip_billing_header",
    "system_in_place",
]
