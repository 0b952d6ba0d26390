"""What one client API is to the rest of the gateway: :class:`Api`, one per package of
``apis/`` (``apis/messages/api.py``, ``apis/chat/api.py``, ``apis/responses/api.py``),
found by the record's endpoint in :data:`prefixgate.apis.API_OF`. The capture and the
``diagnose`` step ask it, never the endpoint's name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefixgate.config import ChannelConfig
from prefixgate.record.cut import Piece
from prefixgate.record.record import Segment

# The segments of a decoded request: (body, *, tools_first, texts, known) -> segments.
SegmentsOf = Callable[..., list[Segment]]


def _not_passed_through(channel: ChannelConfig, body_in: Any, body_out: dict, first: bool) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Api:
    """A client API's rules.

    ``name``: the record's endpoint. ``dialect``: how its requests are cut into segments
    (``"anthropic"``, ``"openai"`` or ``"responses"``), ``diagnostics``: the protocol its
    cache diagnostics answer in. ``segments``: the segments of a decoded request as
    received; ``cut``: the same from its bytes (``raw``, the decoded body, the session's
    previous pieces as received), with each piece's bytes when it has them, or ``None``
    for a body of another shape. ``sent``: the dialect a channel receives the request in.
    ``native``: whether the channel speaks this API itself (its answer passed through, its
    ids its own). ``passed_through``: whether the request sent is the request received, so
    that its segments are the same (``channel, body_in, body_out, tools_first``)."""

    name: str
    dialect: str
    diagnostics: str
    segments: SegmentsOf
    cut: Callable[[bytes, Any, list[Piece] | None], tuple[list[Segment], list[Piece] | None] | None]
    sent: Callable[[ChannelConfig], str]
    native: Callable[[ChannelConfig], bool]
    passed_through: Callable[[ChannelConfig, Any, dict, bool], bool] = _not_passed_through


def kind_native(channel: ChannelConfig) -> bool:
    """A channel whose kind is not ``openai`` speaks the client's API itself."""
    return channel.kind != "openai"


__all__ = ["Api", "SegmentsOf", "kind_native"]
