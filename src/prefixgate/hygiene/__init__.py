"""Prompt-prefix transforms that keep upstream prefix caches valid.

Each transform is a small named step (:class:`HygieneStep`) that says which channels it
applies to; :data:`STEPS` is their order. The pipeline runs them on the typed Anthropic
request before it is converted for an ``openai`` channel (``pipeline.steps.hygiene``), and
``count_tokens`` runs them on the plain request, so a count matches what is sent. They
never touch the request as received (the record keeps that): they return a new one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prefixgate.hygiene.billing import strip_billing_header, strip_billing_header_typed

if TYPE_CHECKING:
    from prefixgate.config import ChannelConfig
    from prefixgate.protocol.messages_body import Request


@dataclass(frozen=True, slots=True)
class HygieneStep:
    """One transform: on the typed request (the gateway's path) and on a plain dict
    (``count_tokens``); each returns ``(request, changed)``."""

    name: str
    applies: Callable[[ChannelConfig], bool]
    typed: Callable[[Request], tuple[Request, bool]]
    plain: Callable[[dict], tuple[dict, bool]]


BILLING_HEADER = HygieneStep(
    name="strip_billing_header",
    applies=lambda ch: ch.strip_billing_header,
    typed=strip_billing_header_typed,
    plain=strip_billing_header,
)

STEPS: tuple[HygieneStep, ...] = (BILLING_HEADER,)


def apply_typed(req: Request, ch: ChannelConfig) -> Request:
    """``req`` after every step that applies to the channel, in order."""
    for step in STEPS:
        if step.applies(ch):
            req, _ = step.typed(req)
    return req


def apply_plain(body: dict, ch: ChannelConfig) -> dict:
    """``apply_typed`` for a plain request."""
    for step in STEPS:
        if step.applies(ch):
            body, _ = step.plain(body)
    return body


__all__ = ["STEPS", "HygieneStep", "apply_plain", "apply_typed", "strip_billing_header"]
