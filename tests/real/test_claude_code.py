"""The real Claude Code CLI (npm ``@anthropic-ai/claude-code``, pinned) through the gateway.

Against the simulated vLLM (``prefixgate.lab.upstream_sim``, block size 32): deterministic and
fast; and against the real vLLM CPU build serving the agent model (a 64k window, answers
that end by themselves), where the second turn's hit comes from the real engine's prefix
cache. A recording wrapper keeps every body the gateway sent upstream. The CLI runs offline
with a throw-away HOME, so it talks to nothing but the gateway (``agents.py``).
"""

from __future__ import annotations

import json
import random
import re

import httpx
import pytest

from tests.real import harness
from tests.real.agents import Claude, check_stable_prefix, converse, engine_settings, stack
from tests.real.reminder import (
    AGENT_ENV,
    PROMPTS,
    REMINDER,
    check_booked_as_the_templates,
    four_turns,
    later_turns_hit,
    model_calls,
)

BLOCK = 32
BILLING = "x-anthropic-billing-header"


def test_two_turns_billing_header_stripped_and_second_turn_hits(claude_exe, tmp_path):
    with stack(tmp_path) as s:
        cli = Claude(claude_exe, s, tmp_path)
        first = cli.run("say hi")
        second = cli.run("and once more", resume=True)
    upstream = s.upstream
    assert first["session_id"] == second["session_id"]
    assert first["result"] and second["result"]
    recs = [r for r in s.records("messages") if r.status == 200]
    assert len(recs) == 2, [(r.status, r.prompt_tokens) for r in recs]
    # the billing header reached the gateway as system[0] ...
    for rec in recs:
        head = rec.segments_in[0]
        assert head.name == "system[0]"
        assert json.loads(rec.texts[head.hash])["text"].startswith(BILLING)
    # ... and never went upstream
    chats = upstream.chats()
    assert len(chats) == 2
    for entry in chats:
        assert BILLING not in json.dumps(entry["body"])
        assert entry["body"]["messages"][0]["role"] == "system"
    # the second turn's cache hit covers the first turn's prompt (all its full blocks)
    p1, c2 = recs[0].prompt_tokens, recs[1].cached_tokens
    assert c2 % BLOCK == 0 and c2 >= (p1 - 1) // BLOCK * BLOCK
    assert second["usage"]["cache_read_input_tokens"] == c2
    assert first["usage"]["cache_read_input_tokens"] == 0


def _notes(seed: int, words: tuple[str, ...], n: int = 5000) -> str:
    rng = random.Random(seed)
    return "Read these notes and reply OK.\n" + " ".join(rng.choice(words) for _ in range(n))


# the simulated vLLM's wording for a prompt over the window
_PROMPT_TOO_LONG = re.compile(r"However, your request has (\d+) input tokens")


def test_context_overflow_makes_the_cli_compact_and_retry(claude_exe, tmp_path):
    """Window 24000: the first long turn fits (~19.5k), the second (~27k) does not; the
    gateway turns vLLM's error into ``prompt is too long``; the CLI compacts and retries."""
    window = 24000
    with stack(tmp_path, max_model_len=window) as s:
        url, upstream = s.url, s.upstream
        cli = Claude(claude_exe, s, tmp_path)
        cli.run(_notes(1, ("red", "green", "blue", "cyan", "black", "white")))
        cli.run(_notes(2, ("alpha", "beta", "gamma", "delta", "omega", "kappa")), resume=True)
        # what the CLI was told, asked directly: Anthropic's wording, which it acts on
        resp = httpx.post(
            url + "/v1/messages",
            headers={"anthropic-version": "2023-06-01", "x-api-key": "k"},
            json={
                "model": s.model,
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "x " * 60000}],
            },
            timeout=60,
        )
    assert resp.status_code == 400
    assert re.fullmatch(
        rf"prompt is too long: \d+ tokens > {window} maximum", resp.json()["error"]["message"]
    )
    # upstream: a prompt over the window was refused ...
    too_long = [
        int(m.group(1))
        for e in upstream.chats()
        if e["status"] == 400 and (m := _PROMPT_TOO_LONG.search(e["error"] or ""))
        if int(m.group(1)) >= window
    ]
    assert too_long, [(e["status"], (e["error"] or "")[:120]) for e in upstream.chats()]
    # ... the client saw Anthropic's wording (recorded as a 400 on /v1/messages) ...
    recs = s.records("messages")
    statuses = [r.status for r in recs]
    first_400 = statuses.index(400)
    assert recs[first_400].error_type == "invalid_request_error"
    # ... and later requests succeeded with a smaller prompt (the compacted history)
    after = [r for r in recs[first_400 + 1 :] if r.status == 200]
    assert len(after) >= 2  # the compaction request and the retried turn
    assert after[-1].prompt_tokens < min(too_long)
    assert after[-1].prompt_tokens < window


def test_two_turns_through_the_real_vllm_hit_its_prefix_cache(claude_exe, vllm_agent, tmp_path):
    """Claude Code (a ~15k-token first prompt) against the real engine with a 64k window:
    two turns with ``--continue``; the billing header never reaches vLLM, turn 1's prompt is
    the head of turn 2's, vLLM serves it from its prefix cache, and the usage the CLI shows
    is vLLM's, in Anthropic's semantics."""
    window = str(harness.AGENT_MAX_MODEL_LEN)
    env = {"CLAUDE_CODE_MAX_CONTEXT_TOKENS": window, "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256"}
    turns = converse(lambda s: Claude(claude_exe, s, tmp_path, **env), tmp_path, vllm_agent)
    session = turns.first["session_id"]
    assert turns.second["session_id"] == session
    check_stable_prefix(turns, volatile=(BILLING, session), block=BLOCK, slack=1)
    assert turns.records[0].prompt_tokens > 10_000  # Claude Code's real prompt, not a toy
    for rec, result in zip(turns.records, (turns.first, turns.second), strict=True):
        usage = result["usage"]
        assert usage["cache_read_input_tokens"] == (rec.cached_tokens or 0)
        assert usage["input_tokens"] == rec.prompt_tokens - (rec.cached_tokens or 0)
    assert turns.hit_rate > 0.9


# -- the engine's template: Claude Code's <total_tokens> reminder (docs/rendering.md) -----


def _conversation(s) -> list:
    """The CLI's model calls: one a turn on these engines."""
    recs = model_calls(s)
    assert len(recs) == len(PROMPTS), [(r.status, r.prompt_tokens) for r in recs]
    return recs


def test_the_reminder_on_a_hoisting_template_hits_with_the_defaults(claude_exe, tmp_path):
    """The simulated vLLM serving the project's DeepSeek-like template (every system
    message gathered at the head): the gateway learns it and delivers the CLI's later
    system messages inside its turns; turns 2-4 hit as on a template that keeps them."""
    with stack(tmp_path, chat_template="hoisting") as s:
        four_turns(Claude(claude_exe, s, tmp_path, **REMINDER))
    recs = _conversation(s)
    assert later_turns_hit(recs) >= 0.9, [(r.prompt_tokens, r.cached_tokens) for r in recs]
    last = s.upstream.chats()[-1]["body"]["messages"]
    # the reminders reached the engine, in place, marked; no later system message left
    assert [m["role"] for m in last].count("system") == 1
    assert sum("<total_tokens>" in json.dumps(m) for m in last[1:]) >= len(PROMPTS)
    assert "<system>\\n<total_tokens>" in json.dumps(last)


def test_the_reminder_on_an_in_place_template_goes_upstream_as_the_cli_sent_it(
    claude_exe, tmp_path
):
    """The simulated vLLM serving a template that keeps system messages where they stand:
    the gateway learns it and leaves the CLI's later system messages alone (system
    messages upstream, where the CLI put them, unmarked); turns 2-4 hit; and the CLI's
    requests replayed through a gateway with ``system_in_place: false`` go upstream byte
    for byte as they did with the defaults."""
    with stack(tmp_path / "defaults", chat_template="in_place") as s:
        four_turns(Claude(claude_exe, s, tmp_path, **REMINDER))
        details = httpx.get(s.url + "/healthz?details=1", timeout=30).json()["details"]
    [rendering] = details["rendering"]
    assert rendering["system"] == "in_place" and rendering["system_in_place"] is False
    recs = _conversation(s)
    assert later_turns_hit(recs) >= 0.9, [(r.prompt_tokens, r.cached_tokens) for r in recs]
    last = s.upstream.chats()[-1]["body"]["messages"]
    reminders = [m for m in last[1:] if "<total_tokens>" in json.dumps(m)]
    assert len(reminders) >= len(PROMPTS)
    assert all(m["role"] == "system" for m in reminders), reminders
    assert "<system>" not in json.dumps(last)
    asked = [e for e in s.received.seen if e["path"] == "/v1/messages"]
    with stack(
        tmp_path / "off", chat_template="in_place", channel={"system_in_place": False}
    ) as off:
        off.replay(asked)
    sent = [e["raw"] for e in s.upstream.chats()]
    assert len(sent) == len(asked) and [e["raw"] for e in off.upstream.chats()] == sent


@pytest.mark.parametrize("events", [False, True])
def test_the_reminder_unprotected_is_booked_and_diagnosed_as_the_templates(
    claude_exe, tmp_path, events
):
    """The same with ``system_in_place: false``: each turn's new reminder lands at the
    head; the ledger books the loss as prefix_changed at the moved system message, the
    doctor names the template's hoisting, and no capacity finding on an unlimited cache."""
    off = {"system_in_place": False}
    with stack(tmp_path, chat_template="hoisting", channel=off, events=events) as s:
        four_turns(Claude(claude_exe, s, tmp_path, **REMINDER))
        s.wait_stored()
    check_booked_as_the_templates(s, _conversation(s), events)


def test_the_reminder_through_the_real_vllm_with_a_hoisting_template(
    claude_exe, vllm_agent_hoisting, tmp_path
):
    """The real vLLM started with the project's hoisting template (``--chat-template``):
    the gateway learns it from vLLM's /tokenize; with the defaults turns 2-4 hit."""
    vllm, _ = vllm_agent_hoisting
    with stack(tmp_path, **engine_settings(vllm)) as s:
        s.until_learned()  # the claim is about the gateway once it knows the template
        four_turns(Claude(claude_exe, s, tmp_path, **AGENT_ENV))
    recs = _conversation(s)
    assert recs[0].prompt_tokens > 10_000  # Claude Code's real prompt
    assert later_turns_hit(recs) >= 0.9, [(r.prompt_tokens, r.cached_tokens) for r in recs]


@pytest.mark.parametrize("events", [False, True])
def test_the_reminder_unprotected_through_the_real_vllm_is_diagnosed(
    claude_exe, vllm_agent_hoisting, tmp_path, events
):
    """The same with ``system_in_place: false``: the real engine recomputes each turn; the
    ledger (from vLLM's KV events, or the cache model) books it as prefix_changed at the
    moved system message; the doctor names the template's hoisting, never capacity."""
    vllm, kv = vllm_agent_hoisting
    settings = engine_settings(vllm, kv if events else None, system_in_place=False)
    with stack(tmp_path, **settings) as s:
        s.until_learned()  # else the first turn's segments are in the assumed order
        four_turns(Claude(claude_exe, s, tmp_path, **AGENT_ENV))
        s.wait_stored()
    check_booked_as_the_templates(s, _conversation(s), events)
