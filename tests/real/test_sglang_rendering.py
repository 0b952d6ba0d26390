"""The engine's template on a REAL SGLang 0.5.23: Claude Code's ``<total_tokens>`` reminder
(a new ``role: system`` message after every prompt) through the gateway to SGLang started
with the project's DeepSeek-like template (``--chat-template``: every system message
gathered at the head), as ``test_claude_code.py`` does against the real vLLM.

The gateway learns the hoisting from SGLang's ``/tokenize``; with the defaults the later
turns hit; with ``system_in_place: false`` each turn recomputes, and the ledger (from
SGLang's KV events, or the cache model) and the doctor say why. One SGLang for the module
(it starts slowly on a loaded machine), its KV cache far larger than the tests' sessions.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.real.agents import Claude, engine_settings, stack
from tests.real.reminder import (
    AGENT_ENV,
    check_booked_as_the_templates,
    four_turns,
    later_turns_hit,
    model_calls,
)


def _report(say, name: str, recs) -> None:
    calls = ", ".join(f"{r.cached_tokens or 0:,}/{r.prompt_tokens:,}" for r in recs)
    say(f"SGLang hoisting, {name}: cached/prompt {calls}; later calls {later_turns_hit(recs):.1%}")


def test_the_reminder_through_sglang_with_a_hoisting_template(
    claude_exe, sglang_hoisting, tmp_path, say
):
    """The gateway learns from SGLang's /tokenize that its template hoists later system
    messages (shown in /healthz details, the protection on); with the defaults the CLI's
    reminders render in place, marked, and turns 2-4 hit."""
    server, _ = sglang_hoisting
    with stack(tmp_path, **engine_settings(server)) as s:
        # the claim is about the gateway once it knows the template
        s.until_learned()
        four_turns(Claude(claude_exe, s, tmp_path, **AGENT_ENV))
        details = httpx.get(s.url + "/healthz?details=1", timeout=30).json()
        last = s.upstream.chats()[-1]["body"]["messages"]
    [rendering] = details["details"]["rendering"]
    assert rendering["system"] == "hoisted" and rendering["source"] == "tokenize", rendering
    assert rendering["system_in_place"] is True
    assert (rendering["same_role"], rendering["tool_results"]) == ("separate", "separate")
    recs = model_calls(s)
    _report(say, "defaults", recs)
    assert recs[0].prompt_tokens > 10_000  # Claude Code's real prompt
    assert later_turns_hit(recs) >= 0.9, [(r.prompt_tokens, r.cached_tokens) for r in recs]
    # the reminders reached SGLang inside the turns, no later system message left
    assert [m["role"] for m in last].count("system") == 1
    assert "<system>\\n<total_tokens>" in json.dumps(last)


@pytest.mark.parametrize("events", [False, True])
def test_the_reminder_unprotected_through_sglang_is_diagnosed(
    claude_exe, sglang_hoisting, tmp_path, say, events
):
    """With ``system_in_place: false`` SGLang recomputes each turn; the ledger (from its KV
    events, or the cache model) books it as prefix_changed at the moved system message;
    a further call within a turn (the CLI makes one in some runs) moves nothing and hits;
    the doctor names the template's hoisting, never capacity."""
    server, kv = sglang_hoisting
    settings = engine_settings(server, kv if events else None, system_in_place=False)
    with stack(tmp_path, **settings) as s:
        s.until_learned()  # else the first turn's segments are in the assumed order
        four_turns(Claude(claude_exe, s, tmp_path, **AGENT_ENV))
        s.wait_stored()
    recs = model_calls(s)
    _report(say, f"protection off, {'events' if events else 'cache model'}", recs)
    check_booked_as_the_templates(s, recs, events)
