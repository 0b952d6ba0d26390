"""The comparison's outcome (:class:`Verdict`), and what each protocol answers with it:
Anthropic's ``diagnostics``, OpenAI's ``prompt_cache_diagnostics``, and the namespaced
extension beside both (``prefixgate_diagnostics``).

The standard objects say only what the vendors define: which part of the request changed
first and about how many tokens after it could have been read from cache. The comparison
is structural: it says nothing of whether the engine actually hit (a structurally
identical turn is "no divergence" even when the engine recomputed it). The extension says
the rest where it is known: the segment as the client named it and as it was sent
upstream, the change's class and shape (found at capture time against the session's
previous request), the fix, and at the end of the answer the engine's own figures.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from prefixgate.diagnostics.compare import Divergence, diverge, engine_order, tokens
from prefixgate.record.compacted import compacted
from prefixgate.record.record import Record
from prefixgate.record.rendered import AT_HEAD

EXTENSION = "prefixgate_diagnostics"  # the key of the extension on every answer

# Reasons each protocol names, by what changed.
NOT_FOUND, UNAVAILABLE, NONE = "not_found", "unavailable", "none"
_ANTHROPIC_PARTS = {"system": "system_changed", "tools": "tools_changed"}
_OPENAI_PARAMS = ("text_format", "reasoning_effort", "verbosity")
_FIX = {
    "model_changed": "send every turn of a conversation to the same model: another model"
    " has its own cache",
    "system_changed": "keep the system prompt byte-stable: move what changes per request (a"
    " date, a counter, an id) after the cached prefix, into the latest message",
    "tools_changed": "send the same tools in the same order, serialized the same way, on"
    " every turn",
    "messages_changed": "send earlier turns back exactly as they were (no edits, no"
    " re-serialization): only append",
    "input_changed": "send earlier input items back exactly as they were: only append",
    "prompt_cache_key_changed": "keep one prompt_cache_key per conversation",
    "context_compacted": "none needed: a compacted context is a new prefix, cached from"
    " this turn on",
    "unavailable": "keep thinking and tool_choice the same between turns",
}
_KNOWN_FIX = {
    "billing_header": "turn on strip_anthropic_billing_header for this channel: Claude"
    " Code's billing header changes every request at the head of the system prompt",
}


class Verdict(NamedTuple):
    """``answer``: ``none`` (nothing diverged), ``not_found``, ``unavailable``, or the
    reason (``model_changed``, ``system_changed``, ``tools_changed``,
    ``messages_changed``; on Responses ``prompt_cache_key_changed``, ``text_format_changed``
    …, ``input_changed``, ``context_compacted``). Token figures are estimates scaled to the
    earlier request's real prompt size when it is known."""

    answer: str
    missed: int | None = None  # tokens of the earlier prompt after the divergence
    reusable: int | None = None  # tokens before it
    at: Divergence | None = None
    upstream: str | None = None  # the first changed segment as sent upstream
    found_in: str | None = None  # "memory" | "store"


def scope(rec: Record) -> str | None:
    """Whose requests a record may be compared with: its key's owner, else its key."""
    return rec.key_owner or rec.key_name


def judge(
    prev: Record | None,
    cur: Record,
    params: dict[str, str],
    *,
    api: str,
    tools_first: bool,
    hoists_system: bool = False,
    found_in: str | None = None,
) -> Verdict:
    """Compare ``cur`` with the earlier request ``prev`` (None: not found) for ``api``
    (``anthropic`` | ``responses`` | ``chat``), both in the engine's order
    (:func:`~prefixgate.diagnostics.compare.engine_order`: ``tools_first``,
    ``hoists_system``)."""
    if prev is None or scope(prev) != scope(cur):
        return Verdict(NOT_FOUND)  # another owner's id says nothing, not even that it exists
    if not prev.segments_in or not cur.segments_in:
        return Verdict(UNAVAILABLE, found_in=found_in)
    before = engine_order(prev.segments_in, tools_first=tools_first, hoists_system=hoists_system)
    now = engine_order(cur.segments_in, tools_first=tools_first, hoists_system=hoists_system)
    real = prev.prompt_tokens
    estimate = None

    def scaled(n: int) -> int:
        nonlocal estimate
        if not real:
            return n
        if estimate is None:
            estimate = tokens(before)
        return round(n * real / estimate) if estimate else n

    whole = real if real else tokens(before)
    if prev.requested_model != cur.requested_model:
        return Verdict("model_changed", whole, 0, found_in=found_in)
    prev_params = prev.diagnosis.params if prev.diagnosis is not None else {}

    def changed(name: str) -> bool:
        return name in prev_params and name in params and prev_params[name] != params[name]

    if api == "responses" and changed("prompt_cache_key"):
        return Verdict("prompt_cache_key_changed", whole, 0, found_in=found_in)
    at = diverge(before, now)
    upstream = _upstream_name(prev, cur) if at is not None else None

    def verdict(answer: str) -> Verdict:
        assert at is not None
        return Verdict(
            answer, scaled(at.missed_tokens), scaled(at.prefix_tokens), at, upstream, found_in
        )

    if api == "anthropic":
        if at is not None and at.part in _ANTHROPIC_PARTS:
            return verdict(_ANTHROPIC_PARTS[at.part])
        if changed("thinking") or changed("tool_choice"):
            return Verdict(UNAVAILABLE, found_in=found_in)
        if at is not None:
            return verdict("messages_changed")
        return Verdict(NONE, 0, whole, found_in=found_in)
    # OpenAI's order: model, prompt_cache_key, tools, the output settings, the input.
    if at is not None and at.part == "tools":
        return verdict("tools_changed")
    for name in _OPENAI_PARAMS:
        if changed(name):
            return Verdict(f"{name}_changed", whole, 0, found_in=found_in)
    if at is not None:
        # a compaction item, or the model's turns dropped (record/compacted.py)
        restarted = compacted(prev.segments_in, cur.segments_in)
        return verdict("context_compacted" if restarted else "input_changed")
    if changed("service_tier"):
        return Verdict("service_tier_changed", whole, 0, found_in=found_in)
    return Verdict(NONE, 0, whole, found_in=found_in)


def _upstream_name(prev: Record, cur: Record) -> str | None:
    """The first segment that differs as sent upstream (already in the engine's order)."""
    if not prev.segments_out or not cur.segments_out:
        return None
    at = diverge(prev.segments_out, cur.segments_out)
    return at.segment if at is not None else None


# -- the standard objects ----------------------------------------------------------------
def anthropic_diagnostics(v: Verdict) -> dict | None:
    """The Message's ``diagnostics``: null when nothing diverged."""
    if v.answer == NONE:
        return None
    if v.answer == NOT_FOUND:
        return {"cache_miss_reason": {"type": "previous_message_not_found"}}
    if v.answer == UNAVAILABLE:
        return {"cache_miss_reason": {"type": "unavailable"}}
    reason = {"type": v.answer, "cache_missed_input_tokens": v.missed or 0}
    return {"cache_miss_reason": reason}


def openai_diagnostics(v: Verdict) -> dict:
    """The Response's ``prompt_cache_diagnostics``."""
    if v.answer == NONE:
        return {"type": "cache_hit"}
    if v.answer == NOT_FOUND:
        return {"type": "comparison_response_not_found"}
    if v.answer == UNAVAILABLE:
        return {"type": "unavailable"}
    return {
        "type": "cache_miss",
        "reason": v.answer,
        "cache_missed_tokens": v.missed or 0,
        "comparison_reusable_tokens": v.reusable or 0,
    }


# -- the extension ---------------------------------------------------------------------
def extension(v: Verdict, rec: Record, compared_with: str | None) -> dict:
    """What only this gateway knows, at the start of the answer: the comparison's
    detail (the changed segment as the client named it and as sent upstream, the estimated
    tokens before and after it), the change's class and shape when the capture saw the same
    change, where the earlier request was found, and the fix."""
    out: dict = {"compared_with": compared_with, "answer": v.answer, "found_in": v.found_in}
    if v.at is not None:
        segment = v.at.segment
        moved = segment is not None and segment.endswith(AT_HEAD)
        if moved:
            segment = segment.removesuffix(AT_HEAD)
        out["changed"] = {
            "part": v.at.part,
            "segment": segment,
            "upstream_segment": v.upstream,
            "prefix_tokens": v.reusable,
            "missed_tokens": v.missed,
        }
        if moved:
            # a role: system message later in the conversation, which the upstream's
            # template renders in the system prompt at the head
            out["changed"]["moved_by_template"] = "head"
        if v.upstream is None and rec.segments_out:
            # the client's request changed, the prompt sent upstream did not (hygiene)
            out["changed"]["reached_engine"] = False
        change = rec.change
        if change is not None and change.segment == segment:
            out["changed"]["class"] = change.cls
            if change.shape is not None:
                out["changed"]["shape"] = _shape(change.shape)
            if change.known:
                out["changed"]["known"] = change.known
    fix = _fix(v, rec)
    if fix:
        out["fix"] = fix
    return out


def _shape(shape) -> dict:
    return msgspec.to_builtins(shape)


_MOVED_FIX = (
    "the upstream's chat template moves every role: system message to the head of the"
    " prompt, so each new one changes the cached prefix: turn on system_in_place for this"
    " channel (the gateway then delivers them where the client put them), or have the"
    " client send them inside its user turns"
)


def _fix(v: Verdict, rec: Record) -> str | None:
    if v.at is not None and v.at.segment is not None and v.at.segment.endswith(AT_HEAD):
        return _MOVED_FIX
    change = rec.change
    if (
        v.at is not None
        and change is not None
        and change.known in _KNOWN_FIX
        and change.segment == v.at.segment
    ):
        return _KNOWN_FIX[change.known]
    return _FIX.get(v.answer)


def engine_truth(prompt: int | None, cached: int | None) -> dict:
    """What the engine said at the end of the answer: its prompt and cached tokens (the
    miss ledger, which splits the rest by cause, goes beside it: ``pipeline/diagnose.py``
    ``extension_tail``)."""
    out: dict = {"prompt_tokens": prompt, "cached_tokens": cached}
    if prompt:
        out["missed_tokens"] = prompt - (cached or 0)
    return out
