"""What the client asked for, checked: the id of the earlier answer to compare with, in
each protocol's field, and the digests of the request's prompt-affecting parameters (the
ones a reason can name: never their values).

An answer's id names its record: ``msg_`` (Anthropic) or ``resp_`` (Responses) and the
record's ``request_id``; on Chat Completions the ``x-request-id`` itself.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, NamedTuple

import msgspec

from prefixgate.errors import InvalidRequest

BETA = "cache-diagnosis-2026-04-07"  # Anthropic's beta name (the field works without it)
CHAT_HEADER = "x-prefixgate-diagnostics"  # the Chat Completions opt-in (no vendor field)
FIRST = "first"  # the chat header's value on a first turn (no earlier request)

_ID = re.compile(r"^(?:msg_|resp_)?([0-9a-f]{32})$")
_encode = msgspec.json.Encoder(order="sorted").encode


class Asked(NamedTuple):
    """A request's ask: ``previous`` is the earlier answer's id as the client sent it
    (``None``: a first turn that opts in); ``options`` the Responses ``prompt_cache_options``
    as sent (echoed)."""

    previous: str | None
    options: dict | None = None


def message_id(request_id: str) -> str:
    return "msg_" + request_id


def response_id(request_id: str) -> str:
    return "resp_" + request_id


def request_id_of(answer_id: str) -> str | None:
    """The record's id in an answer's id, or None when the id is not one this gateway
    gives (then no record can have it)."""
    m = _ID.match(answer_id)
    return m.group(1) if m else None


def _previous(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 256:
        raise InvalidRequest(f"{where}: a string id or null is required", param=where)
    return value


def anthropic_ask(value: Any) -> Asked | None:
    """``diagnostics`` of a Messages request: ``{"previous_message_id": "msg_…" | null}``."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest("diagnostics: an object is required", param="diagnostics")
    extra = set(value) - {"previous_message_id"}
    if extra:
        name = sorted(extra)[0]
        raise InvalidRequest(
            f"diagnostics.{name}: Extra inputs are not permitted", param=f"diagnostics.{name}"
        )
    return Asked(_previous(value.get("previous_message_id"), "diagnostics.previous_message_id"))


_MODES = ("implicit", "explicit")
_TTLS = ("30m", "12h")


def responses_ask(value: Any) -> Asked | None:
    """``prompt_cache_options`` of a Responses request; an ask when it names
    ``comparison_response_id`` (checked either way, and echoed)."""
    if value is None:
        return None
    where = "prompt_cache_options"
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where}: an object is required", param=where)
    mode, ttl = value.get("mode"), value.get("ttl")
    if mode is not None and mode not in _MODES:
        raise InvalidRequest(f"{where}.mode: one of {', '.join(_MODES)}", param=f"{where}.mode")
    if ttl is not None and ttl not in _TTLS:
        raise InvalidRequest(f"{where}.ttl: one of {', '.join(_TTLS)}", param=f"{where}.ttl")
    if "comparison_response_id" not in value:
        return None
    previous = _previous(value["comparison_response_id"], f"{where}.comparison_response_id")
    return Asked(previous, value)


def echoed_options(options: dict | None) -> dict:
    """``prompt_cache_options`` as a response echoes it (the SDK's type needs ``mode`` and
    ``ttl``: the defaults when the request left them out)."""
    options = options or {}
    return {
        "mode": options.get("mode") or "implicit",
        "ttl": options.get("ttl") or "30m",
        "comparison_response_id": options.get("comparison_response_id"),
    }


def chat_ask(headers) -> Asked | None:
    """The Chat Completions opt-in: ``x-prefixgate-diagnostics: <x-request-id>`` of the
    earlier answer, or ``first``."""
    value = headers.get(CHAT_HEADER)
    if value is None:
        return None
    value = value.strip()
    if not value:
        raise InvalidRequest(f"{CHAT_HEADER}: an earlier x-request-id, or {FIRST!r}")
    return Asked(None if value == FIRST else value)


def digest(value: Any) -> str:
    """A short digest of a parameter's value (sorted-key JSON)."""
    try:
        data = _encode(value)
    except (TypeError, ValueError):
        data = repr(value).encode()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def anthropic_params(typed) -> dict[str, str]:
    """Digests of a Messages request's prompt-affecting parameters beyond model, system,
    tools and messages (a change in one is the vendor's ``unavailable``)."""
    return {
        "thinking": digest(typed.thinking),
        "tool_choice": digest(typed.tool_choice),
    }


def responses_params(typed) -> dict[str, str]:
    """Digests of a Responses request's parameters that OpenAI's reasons name."""
    text = typed.text if isinstance(typed.text, dict) else {}
    reasoning = typed.reasoning if isinstance(typed.reasoning, dict) else {}
    return {
        "prompt_cache_key": digest(typed.prompt_cache_key),
        "text_format": digest(text.get("format")),
        "reasoning_effort": digest(reasoning.get("effort")),
        "verbosity": digest(text.get("verbosity")),
        "service_tier": digest(getattr(typed, "service_tier", None)),
    }
