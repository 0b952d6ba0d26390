"""Compaction on the Responses API, served by a Chat Completions engine.

A client whose context fills asks for a compaction in one of two ways (OpenAI's reference;
Codex uses the second with providers it treats as OpenAI's or Azure's):

- ``POST /v1/responses/compact`` with the conversation: the answer is a
  ``response.compaction`` object whose ``output`` is the conversation's user messages
  followed by one ``compaction`` item;
- ``POST /v1/responses`` whose last input item is ``{"type": "compaction_trigger"}``: the
  answer (streamed or not) has exactly one output item, a ``compaction`` item.

A later request carries the ``compaction`` item in its input, in place of the history it
replaced. The vendor's item holds ``encrypted_content`` that only its servers can read. A
self-hosted engine has no such state, and this gateway keeps none: the gateway asks the
engine itself for a summary (the conversation as it is, tools included, so that the
engine's prefix cache serves it, then :data:`SUMMARY_REQUEST` as a user message), and
the item's ``encrypted_content`` is that summary in an envelope (:func:`seal`: a version
tag and the UTF-8 text in base64url; not encrypted: the client holds the conversation it
summarises anyway). A later ``compaction`` item is opened (:func:`unseal`) and sent to the
engine as a user message, :data:`SUMMARY_HEAD` and the summary: what the engine can render.
An item the gateway did not seal (one from the vendor's own API) cannot be read and is
refused with a 400 that says so.
"""

from __future__ import annotations

import base64
import binascii
import secrets

ENVELOPE = "pgc1."  # what every encrypted_content this gateway writes starts with

SUMMARY_REQUEST = (
    "Your context window is nearly full, so this conversation is being compacted. Write a"
    " summary that lets you, with nothing else, carry on the work where it stands: the"
    " task and what the user asked for, what has been done so far and what was found,"
    " the decisions taken and why, the files and commands that matter, and what remains"
    " to do next. Reply with the summary only; call no tool."
)

SUMMARY_HEAD = (
    "The earlier part of this conversation was compacted. Its summary, written when the"
    " context was compacted, follows; continue the work from it.\n\n"
)


def seal(summary: str) -> str:
    """The ``encrypted_content`` of a compaction item holding ``summary``."""
    return ENVELOPE + base64.urlsafe_b64encode(summary.encode()).decode()


def unseal(content: str) -> str | None:
    """The summary in an ``encrypted_content`` :func:`seal` wrote; None for another's."""
    if not content.startswith(ENVELOPE):
        return None
    try:
        return base64.urlsafe_b64decode(content[len(ENVELOPE) :].encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def compaction_item(summary: str) -> dict:
    """The ``compaction`` output item for the engine's ``summary``."""
    return {
        "id": f"cmp_{secrets.token_hex(12)}",
        "type": "compaction",
        "encrypted_content": seal(summary),
    }
