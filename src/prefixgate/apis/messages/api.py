"""The Anthropic Messages API (``POST /v1/messages``): its rules as :data:`MESSAGES`."""

from __future__ import annotations

from typing import Any

from prefixgate.apis.api import Api, kind_native
from prefixgate.config import ChannelConfig
from prefixgate.record.cut import Piece, cut_from_bytes, cut_from_pieces
from prefixgate.record.segments import segments_anthropic


def _cut(raw: bytes, body: Any, previous: list[Piece] | None):
    lent = getattr(body, "pieces", None)
    if lent is not None:  # the decode cut it
        return cut_from_pieces(lent, "anthropic", previous=previous, same=body.lent)
    return cut_from_bytes(raw, "anthropic", previous=previous)


def _sent(channel: ChannelConfig) -> str:
    return "openai" if channel.kind == "openai" else "anthropic"


MESSAGES = Api(
    name="messages",
    dialect="anthropic",
    diagnostics="anthropic",
    segments=segments_anthropic,
    cut=_cut,
    sent=_sent,
    native=kind_native,
)
