"""The real opencode CLI (npm ``opencode-ai``, pinned) through the gateway's Chat Completions.

An OpenAI-compatible provider (``@ai-sdk/openai-compatible``, bundled in the binary) points
it at the gateway; ``opencode run`` runs a turn without a terminal, ``--continue``
continues the last session. Beside the first turn it asks for a title (same endpoint, no
tools): the conversation is the requests with tools. Against the simulated vLLM (exact
tokens, block size 32) and against the real vLLM CPU build serving the agent model.
"""

from __future__ import annotations

from tests.real.agents import Opencode, check_stable_prefix, converse

BLOCK = 32


def _session(turns) -> str:
    ids = {e["sessionID"] for e in (*turns.first, *turns.second)}
    assert len(ids) == 1, ids  # the second turn continued the first's session
    return ids.pop()


def _check_usage(turns) -> None:
    """opencode shows ``input`` as the uncached part and ``cache.read`` as the rest."""
    seen = [Opencode.usage(turns.first), Opencode.usage(turns.second)]
    for rec, usage in zip(turns.records, seen, strict=True):
        cached = rec.cached_tokens or 0
        assert usage["cache"]["read"] == cached
        assert usage["input"] == rec.prompt_tokens - cached


def test_two_turns_on_the_simulated_vllm(opencode_exe, tmp_path):
    turns = converse(lambda s: Opencode(opencode_exe, s, tmp_path), tmp_path)
    session = _session(turns)
    assert Opencode.answer(turns.first) and Opencode.answer(turns.second)
    check_stable_prefix(turns, volatile=(session,), block=BLOCK, slack=0)
    for rec in turns.records:
        assert rec.endpoint == "chat" and rec.stream and rec.client == "opencode"
    _check_usage(turns)
    assert turns.hit_rate > 0.9


def test_two_turns_through_the_real_vllm_hit_its_prefix_cache(opencode_exe, vllm_agent, tmp_path):
    turns = converse(lambda s: Opencode(opencode_exe, s, tmp_path), tmp_path, vllm_agent)
    check_stable_prefix(turns, volatile=(_session(turns),), block=BLOCK, slack=1)
    assert turns.records[0].prompt_tokens > 5_000  # opencode's real prompt and tools
    _check_usage(turns)
    assert turns.hit_rate > 0.9
