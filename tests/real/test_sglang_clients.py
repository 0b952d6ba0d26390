"""Claude Code, the Codex CLI and opencode (the pinned npm packages) through the gateway
against a REAL SGLang 0.5.23 serving the agent model (a 64k window, answers that end by
themselves; page size 32, ``--enable-cache-report``): two turns each, turn 1's prompt in
place at the head of turn 2's, SGLang serving it from its radix cache, and the usage each
CLI shows is SGLang's, in the client's semantics. One SGLang for the three (it takes ~2 GB
and a minute to start)."""

from __future__ import annotations

from tests.real import harness
from tests.real.agents import (
    Claude,
    Codex,
    Opencode,
    check_stable_prefix,
    converse,
    converse_again,
)
from tests.real.test_claude_code import BILLING
from tests.real.test_codex import _check_usage as check_codex_usage
from tests.real.test_codex import _session as codex_session
from tests.real.test_opencode import _check_usage as check_opencode_usage
from tests.real.test_opencode import _session as opencode_session

PAGE = 32


def _report(say, name: str, turns) -> None:
    one, two = turns.records
    say(
        f"{name} on SGLang: turn 1 {one.prompt_tokens:,}, turn 2 {two.prompt_tokens:,}, "
        f"cached {two.cached_tokens or 0:,}, hit {turns.hit_rate:.1%}"
    )


def test_claude_code_two_turns_on_sglang(claude_exe, sglang_agent, tmp_path, say):
    window = str(harness.AGENT_MAX_MODEL_LEN)
    env = {"CLAUDE_CODE_MAX_CONTEXT_TOKENS": window, "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256"}
    turns = converse_again(
        lambda s, where: Claude(claude_exe, s, where, **env), tmp_path, sglang_agent, say
    )
    session = turns.first["session_id"]
    assert turns.second["session_id"] == session
    # SGLang does not drop the billing header itself: the gateway's strip keeps it out
    check_stable_prefix(turns, volatile=(BILLING, session), block=PAGE, slack=1)
    _report(say, "Claude Code", turns)
    assert turns.records[0].prompt_tokens > 10_000
    for rec, result in zip(turns.records, (turns.first, turns.second), strict=True):
        usage = result["usage"]
        assert usage["cache_read_input_tokens"] == (rec.cached_tokens or 0)
        assert usage["input_tokens"] == rec.prompt_tokens - (rec.cached_tokens or 0)
    assert turns.hit_rate > 0.9


def test_codex_two_turns_on_sglang(codex_exe, sglang_agent, tmp_path, say):
    turns = converse(lambda s: Codex(codex_exe, s, tmp_path), tmp_path, sglang_agent)
    _report(say, "Codex CLI", turns)
    check_stable_prefix(turns, volatile=(codex_session(turns), "turn_id"), block=PAGE, slack=1)
    assert turns.records[0].prompt_tokens > 5_000
    check_codex_usage(turns)
    assert turns.hit_rate > 0.9


def test_opencode_two_turns_on_sglang(opencode_exe, sglang_agent, tmp_path, say):
    turns = converse(lambda s: Opencode(opencode_exe, s, tmp_path), tmp_path, sglang_agent)
    _report(say, "opencode", turns)
    check_stable_prefix(turns, volatile=(opencode_session(turns),), block=PAGE, slack=1)
    assert turns.records[0].prompt_tokens > 5_000
    check_opencode_usage(turns)
    assert turns.hit_rate > 0.9
