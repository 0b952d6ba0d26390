"""The OpenAI Responses API (``POST /v1/responses`` and ``/v1/responses/compact``): its
rules as :data:`RESPONSES`. Converted to Chat for a ``responses_api: convert`` channel,
sent as it came to a ``passthrough`` one."""

from __future__ import annotations

from typing import Any

from prefixgate.apis.api import Api
from prefixgate.apis.responses.segments import cut_responses, segments_responses
from prefixgate.config import ChannelConfig
from prefixgate.record.cut import Piece


def _cut(raw: bytes, body: Any, previous: list[Piece] | None):
    return cut_responses(raw, previous)


def _sent(channel: ChannelConfig) -> str:
    return "responses" if channel.responses_api == "passthrough" else "openai"


def _native(channel: ChannelConfig) -> bool:
    return channel.kind != "openai" or channel.responses_api == "passthrough"


RESPONSES = Api(
    name="responses",
    dialect="responses",
    diagnostics="responses",
    segments=segments_responses,
    cut=_cut,
    sent=_sent,
    native=_native,
)
