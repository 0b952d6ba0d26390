"""The OpenAI Chat Completions API (``POST /v1/chat/completions``): its rules as
:data:`CHAT`. Sent as it came but for the model and the channel's Chat hygiene
(``steps.py``'s ``convert_chat``)."""

from __future__ import annotations

from typing import Any

from prefixgate.apis.api import Api, kind_native
from prefixgate.config import ChannelConfig
from prefixgate.record.cut import Piece, cut_from_bytes
from prefixgate.record.segments import segments_openai


def _cut(raw: bytes, body: Any, previous: list[Piece] | None):
    return cut_from_bytes(raw, "openai", previous=previous)


def _sent(channel: ChannelConfig) -> str:
    return "openai"


def _passed_through(channel: ChannelConfig, body_in: Any, body_out: dict, first: bool) -> bool:
    """The very same messages and tools, in the same order (the tools first, as sent):
    the same segments."""
    return (
        channel.kind == "openai"
        and first
        and body_out.get("messages") is body_in.get("messages")
        and body_out.get("tools") is body_in.get("tools")
    )


CHAT = Api(
    name="chat",
    dialect="openai",
    diagnostics="chat",
    segments=segments_openai,
    cut=_cut,
    sent=_sent,
    native=kind_native,
    passed_through=_passed_through,
)
