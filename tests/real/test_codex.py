"""The real Codex CLI (npm ``@openai/codex``, pinned) through the gateway's ``/v1/responses``.

Codex speaks only the Responses API: a custom provider with ``wire_api = "responses"``
points it at the gateway, which converts each request to Chat Completions for the upstream
and the answer back into the Responses event sequence. ``codex exec`` runs a turn without a
terminal; ``codex exec resume --last`` continues the session. Against the simulated vLLM
(exact tokens, block size 32) and against the real vLLM CPU build serving the agent model.
"""

from __future__ import annotations

from tests.real.agents import Codex, check_stable_prefix, converse

BLOCK = 32


def _session(turns) -> str:
    ids = {e["thread_id"] for e in (*turns.first, *turns.second) if e["type"] == "thread.started"}
    assert len(ids) == 1, ids  # the second turn continued the first's thread
    return ids.pop()


def _check_usage(turns) -> None:
    """Codex shows the thread's usage added up over its turns, in OpenAI's semantics
    (``input_tokens`` includes the cached part): each turn's share is the upstream's."""
    seen = [Codex.usage(turns.first), Codex.usage(turns.second)]
    before = {"input_tokens": 0, "cached_input_tokens": 0}
    for rec, usage in zip(turns.records, seen, strict=True):
        assert usage["input_tokens"] - before["input_tokens"] == rec.prompt_tokens
        assert usage["cached_input_tokens"] - before["cached_input_tokens"] == (
            rec.cached_tokens or 0
        )
        before = usage


def test_two_turns_on_the_simulated_vllm(codex_exe, tmp_path):
    turns = converse(lambda s: Codex(codex_exe, s, tmp_path), tmp_path)
    session = _session(turns)
    assert Codex.answer(turns.first) and Codex.answer(turns.second)
    # what Codex sent: its session in the headers and prompt_cache_key, turn ids in
    # client_metadata; none of it reaches the upstream's prompt
    check_stable_prefix(turns, volatile=(session, "turn_id", "x-codex"), block=BLOCK, slack=0)
    for rec in turns.records:
        assert rec.endpoint == "responses" and rec.stream
        assert rec.session_id == session and rec.client == "codex_exec"
    first, second = turns.bodies
    assert first["messages"][0]["role"] == "system"  # Codex's developer messages
    assert second["messages"][-2]["role"] == "assistant"  # turn 1's answer, in place
    assert second["messages"][-1]["role"] == "user"
    _check_usage(turns)
    assert turns.hit_rate > 0.9


def test_two_turns_through_the_real_vllm_hit_its_prefix_cache(codex_exe, vllm_agent, tmp_path):
    turns = converse(lambda s: Codex(codex_exe, s, tmp_path), tmp_path, vllm_agent)
    session = _session(turns)
    check_stable_prefix(turns, volatile=(session, "turn_id"), block=BLOCK, slack=1)
    assert turns.records[0].prompt_tokens > 5_000  # Codex's real instructions and tools
    _check_usage(turns)
    assert turns.hit_rate > 0.9
