"""Whether a request's conversation is a compacted one: its history restarted by design.

An agent whose context fills replaces its history with a summary (a compaction): Claude
Code starts again from a summary in a user message, Codex keeps the user messages and adds
a summary (in a user message, or in a Responses ``compaction`` item). The request after it
has a new prefix from the point where the history was rewritten. That is not a breaker: no
setting or transform would have kept the prefix, and the cache serves the new one from the
next turn on. Told apart by structure alone (segment names and hashes, never text): the request holds
a ``compaction`` item the previous one did not, or it holds fewer of the model's own turns
(assistant messages, tool calls, reasoning) than the previous one did, which a growing
conversation never does (a rewind to an earlier turn also does: a new history too).
"The previous one" is the request the new one extends most (its thread's predecessor) and
also the session's latest request when the new one keeps that one's conversation but not
the model's turns (:func:`rewritten`): Codex's own compaction asks for the summary in a
request that ends with the model's answer, then starts the turn after from the user
messages and the summary, which holds no more of the model's turns than the turn before
the compaction did.

The summary request itself is named by the client where it says so
(:func:`summary_request`: Codex's turn metadata, ``request_kind: compaction``). Codex's
own leaves the tools out, so its prefix breaks after the system prompt: a step of the
compaction, recorded with the same class, not a breaker.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import msgspec

from prefixgate.record.record import Segment
from prefixgate.record.shape import COMPACTED

__all__ = ["COMPACTED", "Marks", "compacted", "marks_of", "rewritten", "summary_request"]
_MODEL_TURNS = (":assistant", ":function_call", ":custom_tool_call", ":reasoning")
CODEX_TURN_METADATA = "x-codex-turn-metadata"  # a JSON string in ``client_metadata``


def _is_model_turn(s: Segment) -> bool:
    return s.kind == "message" and s.name.endswith(_MODEL_TURNS)


class Marks(NamedTuple):
    """What :func:`compacted` and :func:`rewritten` look at in a request as received: how
    many of the model's own turns it holds, and the hashes of its ``compaction`` items."""

    model_turns: int
    compactions: frozenset[str]


def marks_of(segments: Iterable[Segment]) -> Marks:
    """One walk over the segments (a request's marks are kept with it, so that the next
    request is compared without walking this one again)."""
    turns = 0
    items: set[str] = set()
    for s in segments:
        name = s.name
        if name.endswith(_MODEL_TURNS):
            if s.kind == "message":
                turns += 1
        elif name.endswith(":compaction"):
            items.add(s.hash)
    return Marks(turns, frozenset(items))


def compacted(prev: Iterable[Segment] | Marks, cur: Iterable[Segment] | Marks) -> bool:
    """``cur`` (a request as received) holds a compacted form of ``prev``'s conversation
    (each given as its segments or as their :func:`marks_of`)."""
    a = prev if isinstance(prev, Marks) else marks_of(prev)
    b = cur if isinstance(cur, Marks) else marks_of(cur)
    if b.compactions - a.compactions:
        return True
    return b.model_turns < a.model_turns


def rewritten(
    latest_in: Iterable[Segment] | Marks,
    latest_out: Iterable[Segment],
    cur_in: Iterable[Segment] | Marks,
    cur_out: Iterable[Segment],
) -> bool:
    """``cur`` holds fewer of the model's turns than the session's latest request and
    still a message of its conversation from before the model's first turn there (by
    the hashes sent upstream: a client may re-encode an item it keeps). A request of
    another thread (a sub-agent's) shares none of those messages. ``latest_in`` and
    ``cur_in``: the segments as received, or their :func:`marks_of`."""
    a = latest_in if isinstance(latest_in, Marks) else marks_of(latest_in)
    b = cur_in if isinstance(cur_in, Marks) else marks_of(cur_in)
    if b.model_turns >= a.model_turns:
        return False
    before: set[str] = set()
    for s in latest_out:
        if _is_model_turn(s):
            break
        if s.kind == "message":
            before.add(s.hash)
    return any(s.kind == "message" and s.hash in before for s in cur_out)


def summary_request(client_metadata: Any) -> bool:
    """The client says the request asks for a compaction's summary: Codex's turn
    metadata (``client_metadata["x-codex-turn-metadata"]``, a JSON string) with
    ``request_kind: compaction`` (its own summary turn, or the provider's compaction)."""
    if not isinstance(client_metadata, dict):
        return False
    meta = client_metadata.get(CODEX_TURN_METADATA)
    if not isinstance(meta, str) or '"compaction"' not in meta:
        return False
    try:
        doc = msgspec.json.decode(meta)
    except msgspec.DecodeError:
        return False
    return isinstance(doc, dict) and doc.get("request_kind") == "compaction"
