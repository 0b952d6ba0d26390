"""The client APIs, one package each: its request's conversion to OpenAI Chat, its answer
and stream from Chat, its segments, and one :class:`~prefixgate.apis.api.Api` object with
its rules (``api.py``). :data:`API_OF` finds an API by the record's endpoint."""

from __future__ import annotations

from prefixgate.apis.api import Api
from prefixgate.apis.chat.api import CHAT
from prefixgate.apis.messages.api import MESSAGES
from prefixgate.apis.responses.api import RESPONSES

API_OF: dict[str, Api] = {api.name: api for api in (MESSAGES, CHAT, RESPONSES)}

__all__ = ["API_OF", "CHAT", "MESSAGES", "RESPONSES", "Api"]
