"""Whether a request's conversation is a compacted one: its history restarted by design.

An agent whose context fills replaces its history with a summary (a compaction): Claude
Code starts again from a summary in a user message, Codex keeps the user messages and adds
a summary (in a user message, or in a Responses ``compaction`` item). The request after it
has a new prefix from the point where the history was rewritten. That is not a breaker: no
setting or transform would have kept the prefix, and the cache serves the new one from the
next turn on. Told apart by structure alone (segment names, never text): the request holds
a ``compaction`` item the previous one did not, or it holds fewer of the model's own turns
(assistant messages, tool calls, reasoning) than the previous one did, which a growing
conversation never does (a rewind to an earlier turn also does: a new history too).
"""

from __future__ import annotations

from collections.abc import Iterable

from prefixgate.record.model import Segment
from prefixgate.record.shape import COMPACTED

__all__ = ["COMPACTED", "compacted"]
_MODEL_TURNS = (":assistant", ":function_call", ":custom_tool_call", ":reasoning")


def _model_turns(segments: Iterable[Segment]) -> int:
    return sum(1 for s in segments if s.kind == "message" and s.name.endswith(_MODEL_TURNS))


def _compaction_items(segments: Iterable[Segment]) -> set[str]:
    return {s.hash for s in segments if s.name.endswith(":compaction")}


def compacted(prev: Iterable[Segment], cur: Iterable[Segment]) -> bool:
    """``cur`` (a request as received) holds a compacted form of ``prev``'s conversation."""
    prev, cur = list(prev), list(cur)
    if _compaction_items(cur) - _compaction_items(prev):
        return True
    return _model_turns(cur) < _model_turns(prev)
