"""Claude Code's ``<total_tokens>`` reminder through the gateway to an engine serving a
chat template that gathers every system message at the head (docs/rendering.md): the
set-up and the checks that the simulated vLLM's, the real vLLM's and the real SGLang's
tests share (``test_claude_code.py``, ``test_sglang_rendering.py``).

With the reminder on, the CLI adds a new ``role: system`` message after each user prompt
(the tokens left), the earlier ones unchanged. A model call that brings a new one (each
turn's first call) changes the head of the prompt as such a template renders it; a further
call within a turn that brings none (the CLI made one in some runs) moves nothing.
"""

from __future__ import annotations

import re

from prefixgate.doctor import diagnose
from tests.real import harness
from tests.real.agents import Claude

REMINDER = {"CLAUDE_CODE_TOTAL_TOKENS_REMINDER": "countdown"}
# a real engine serving the agent model: its window, answers that end
AGENT_ENV = {
    **REMINDER,
    "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(harness.AGENT_MAX_MODEL_LEN),
    "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256",
}
PROMPTS = ("say hi", "and once more", "and a third time", "and a last one")
_LATER_SYSTEM = re.compile(r"messages\[\d+\]:system")


def four_turns(cli: Claude) -> None:
    for i, prompt in enumerate(PROMPTS):
        cli.run(prompt, resume=i > 0)


def later_turns_hit(recs) -> float:
    """The token-weighted hit of the calls after the first."""
    later = recs[1:]
    return sum(r.cached_tokens or 0 for r in later) / sum(r.prompt_tokens for r in later)


def tools_sent(rec) -> bool:
    return any(seg.name == "tools" for seg in rec.segments_in or ())


def model_calls(s) -> list:
    """The CLI's model calls (with its tools, answered), at least one a turn."""
    recs = [r for r in s.records("messages") if r.status == 200 and tools_sent(r)]
    assert len(recs) >= len(PROMPTS), [(r.status, r.prompt_tokens) for r in recs]
    return recs


def later_system_messages(rec) -> int:
    """How many ``role: system`` messages the request held after its start, as received."""
    return sum(bool(_LATER_SYSTEM.fullmatch(seg.name)) for seg in rec.segments_in or ())


def new_reminder(recs) -> list[bool]:
    """Per call: whether it brought a system message that no earlier call held."""
    seen, out = 0, []
    for rec in recs:
        n = later_system_messages(rec)
        out.append(n > seen)
        seen = max(seen, n)
    return out


def check_booked_as_the_templates(s, recs, events: bool) -> None:
    """An unprotected conversation (``system_in_place: false``) on an engine whose template
    gathers system messages at the head: each call that brings a new reminder (one a turn)
    recomputes, and its ledger (from KV events, or the cache model) books the loss as
    prefix_changed at the moved system message, never evicted; a call that brings none
    (the CLI sent turn 1's request again, its user message changed, in some runs) moves
    nothing at the head: it hits, and what it misses is not booked at the head. The doctor
    names the template's hoisting, never capacity."""
    brought = new_reminder(recs)
    opening = [r for r, new in zip(recs, brought, strict=True) if new]
    assert len(opening) >= len(PROMPTS), [(later_system_messages(r), r.prompt_tokens) for r in recs]
    assert later_turns_hit(opening) < 0.5, [(r.prompt_tokens, r.cached_tokens) for r in recs]
    ledgers = s.ledgers(recs)
    for rec, x, new in list(zip(recs, ledgers, brought, strict=True))[1:]:
        assert x is not None, f"no ledger for {rec.request_id}"
        assert x.source == ("events" if events else "model")
        assert x.evicted == 0, x
        if new:
            assert (x.changed_segment or "").endswith(":system@head"), x
            assert x.prefix_changed > 0.5 * x.prompt_tokens, x
        else:  # nothing moved to the head: it hits what the call before it computed
            assert not (x.changed_segment or "").endswith("@head"), x
            assert (rec.cached_tokens or 0) >= 0.9 * rec.prompt_tokens, x
    kinds = {f.kind: f for f in diagnose(s.dsn).findings}
    assert "moves each new system message to the head" in kinds["template_hoisting"].title
    assert "kv_capacity" not in kinds
