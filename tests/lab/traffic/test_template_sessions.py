"""Sessions whose hit depends on the engine's template, through the real gateway over the
simulated vLLM (the project's own templates; the official HTTP API on loopback): the
protection against a hoisting template, the ledger and the doctor in the engine's order,
with and without KV events, and the Qwen3-like reasoning case with its trade-off."""

from __future__ import annotations

import pytest

from prefixgate.lab.traffic.template_sessions import (
    reminder_session,
    thinking_loop_session,
    through_gateway,
)
from prefixgate.lab.upstream_sim import SimSettings, running_upstreams

MODEL = "claude-haiku-4-5"


def _kinds(played) -> dict:
    return {f.kind: f for f in played.diagnosis.findings}


@pytest.mark.parametrize("events", [False, True])
def test_a_hoisting_template_is_protected_by_default_and_diagnosed_when_not(tmp_path, events):
    on = through_gateway(
        reminder_session(MODEL, 4), tmp_path / "on", template="hoisting", events=events
    )
    off = through_gateway(
        reminder_session(MODEL, 4),
        tmp_path / "off",
        template="hoisting",
        events=events,
        system_in_place=False,
    )
    # the defaults: turns after the first hit as if the template kept them in place
    assert on.hit_rate() >= 0.9, on.usage
    assert all(x.prefix_changed == 0 and x.evicted == 0 for x in on.ledgers)
    # unprotected: each new reminder at the head, the conversation recomputed
    assert off.hit_rate() < 0.3, off.usage
    source = "events" if events else "model"
    for x in off.ledgers[1:]:
        assert x.source == source
        assert x.changed_segment.endswith(":system@head"), x
        assert x.prefix_changed > 0.7 * x.prompt_tokens, x
        assert x.evicted == 0  # nothing was evicted: the cache is unlimited
    kinds = _kinds(off)
    hoisting = kinds["template_hoisting"]
    assert "moves each new system message to the head" in hoisting.title
    assert hoisting.facts["source"] == source and hoisting.facts["requests"] == 3
    assert any("system_in_place: true" in f for f in hoisting.fix)
    assert any("CLAUDE_CODE_TOTAL_TOKENS_REMINDER=off" in f for f in hoisting.fix)
    assert "kv_capacity" not in kinds
    assert "template_hoisting" not in _kinds(on) and "kv_capacity" not in _kinds(on)


def test_a_template_that_keeps_system_messages_in_place_is_left_alone(tmp_path):
    auto = through_gateway(reminder_session(MODEL, 3), tmp_path / "auto", template="in_place")
    off = through_gateway(
        reminder_session(MODEL, 3), tmp_path / "off", template="in_place", system_in_place=False
    )
    assert auto.usage == off.usage  # the same prompts: nothing was changed
    assert auto.hit_rate() >= 0.9
    assert all(not x.prefix_changed for x in auto.ledgers)
    assert "template_hoisting" not in _kinds(auto)


@pytest.mark.parametrize("events", [False, True])
def test_reasoning_rendered_only_after_the_last_query_is_measured_and_explained(tmp_path, events):
    qwen = through_gateway(
        thinking_loop_session(MODEL), tmp_path / "q", template="reasoning_last_query", events=events
    )
    always = through_gateway(
        thinking_loop_session(MODEL), tmp_path / "a", template="in_place", events=events
    )
    dropped = through_gateway(
        thinking_loop_session(MODEL),
        tmp_path / "d",
        template="reasoning_last_query",
        events=events,
        history_thinking="drop",
    )
    new_turn = -1
    # within the loop every call hits all of the previous prompt (but its partial block);
    # the new user turn recomputes the loop with the Qwen3-like template only
    for (prev, _), (_, cached) in zip(qwen.usage[:-2], qwen.usage[1:-1], strict=True):
        assert cached >= prev - 32
    assert qwen.hit_rate(new_turn) < 0.5 < 0.9 <= always.hit_rate(new_turn)
    assert dropped.hit_rate(new_turn) >= 0.9
    last = qwen.ledgers[new_turn]
    assert last.changed_segment.endswith(":assistant/no-reasoning"), last
    assert last.prefix_changed > 0.5 * last.prompt_tokens and last.evicted == 0
    finding = _kinds(qwen)["template_reasoning"]
    assert "only after the last user query" in finding.title
    assert any("history_thinking: drop" in f for f in finding.fix)
    assert "kv_capacity" not in _kinds(qwen)


def test_an_engine_at_a_url_is_played_once_the_gateway_knows_its_template(tmp_path):
    """Over an engine the bench did not start (a real vLLM or SGLang; here the simulated
    one serving the hoisting template): the session goes once the gateway has learned the
    template from the engine's /tokenize, so every turn is protected."""
    sim = SimSettings(block_size=32, chat_template="hoisting", max_model_len=1_000_000)
    with running_upstreams(sim, replicas=1) as [up]:
        played = through_gateway(
            reminder_session(MODEL, 4), tmp_path, template=None, base_url=up.base_url
        )
    assert played.hit_rate() >= 0.9, played.usage
    assert all(x.prefix_changed == 0 for x in played.ledgers)
    assert "template_hoisting" not in _kinds(played)
