"""Long sessions through the gateway against the real vLLM with a small window
(``vllm_agent_small``: the agent model, 32k tokens), until the real CLIs compact, and on:
Claude Code after the gateway's ``prompt is too long``, Codex through the gateway's
Responses compaction and by its own summary turn (``compactions.py``). The turn after a
compaction is recorded as a compacted context, which the doctor never calls a breaker.
Figures: ``benchmarks/compaction.py``, ``docs/diagnostics.md``."""

from __future__ import annotations

import pytest

from prefixgate.apis.responses.compaction import SUMMARY_HEAD, SUMMARY_REQUEST
from prefixgate.doctor import breakers
from prefixgate.engine.errors import parse_context_error
from prefixgate.store import open_store
from tests.real import harness
from tests.real.compactions import claude_overflows, codex_compacts, hit_rate, holds


def _no_breaker(session) -> None:
    with open_store(session.dsn) as store:
        assert breakers.load(store) == []


def _not_a_breaker(rec) -> None:
    assert rec.change is None or rec.change.cls == "context_compacted", rec.change


def test_claude_code_compacts_after_prompt_is_too_long_and_goes_on(
    claude_exe, vllm_agent_small, tmp_path
):
    s = claude_overflows(claude_exe, vllm_agent_small, tmp_path)
    statuses = [r.status for r in s.records]
    refused = statuses.index(400)
    rec = s.records[refused]
    # the engine refused the prompt; the CLI was told in Anthropic's words, which it acts on
    assert rec.error_type == "invalid_request_error"
    after = [r for r in s.records[refused + 1 :] if r.status == 200]
    # the summary requests extend the conversation (its prefix cached); the retried turn
    # starts from the summary, recorded as a compacted context (not a breaker)
    restarts = [i for i, r in enumerate(after) if r.change and r.change.cls == "context_compacted"]
    assert restarts, [(r.prompt_tokens, r.change) for r in after]
    asks, retried, last = after[: restarts[0]], after[restarts[0]], after[-1]
    assert asks and all(r.cached_tokens and r.cached_tokens > 10_000 for r in asks)
    # smaller than the prompt the engine refused (its count in its own error), in the window
    refusal = next(parse_context_error(c["error"]) for c in s.chats if c["status"] == 400)
    assert refusal.maximum == harness.SMALL_WINDOW
    assert retried.prompt_tokens < refusal.prompt
    assert all(r.prompt_tokens < harness.SMALL_WINDOW for r in after)
    for rec in after:
        _not_a_breaker(rec)
    # the session went on: the last turn read the compacted conversation from the cache
    assert last is not retried and s.outputs[-1]["session_id"] == s.outputs[0]["session_id"]
    assert last.cached_tokens >= retried.prompt_tokens - 2 * 32 * 2
    _no_breaker(s)


@pytest.mark.parametrize(
    "name",
    ["azure", "prefixgate"],
)
def test_codex_compacts_through_the_gateway_and_goes_on(
    codex_exe, vllm_agent_small, tmp_path, name
):
    """``azure``: Codex asks the gateway (a ``compaction_trigger``) and sends the
    ``compaction`` item back; ``prefixgate``: Codex writes its own summary turn."""
    s = codex_compacts(codex_exe, vllm_agent_small, tmp_path, name=name)
    assert all(r.status == 200 for r in s.records), [(r.status, r.error_type) for r in s.records]
    asks = [i for i, r in enumerate(s.records) if _asks(r)]
    assert asks, "Codex never compacted"
    turns = [r for r in s.records[asks[0] + 1 :] if not _asks(r)]
    assert turns, "no turn after the compaction"
    if name == "azure":
        for i in asks:  # the summary request reads the conversation from the cache
            rec = s.records[i]
            assert rec.cached_tokens and rec.cached_tokens > rec.prompt_tokens / 2
        chats = [c["body"] for c in s.chats]
        gateway_asks = [b for b in chats if b["messages"][-1]["content"] == SUMMARY_REQUEST]
        assert len(gateway_asks) == len(asks)
        for body in gateway_asks:  # with the tools (their prefix cached), and no call
            assert body["tool_choice"] == "none" and body["tools"]
        # every turn after it carried the compaction item, sent upstream as its summary
        assert all(holds(r, ":compaction") for r in turns)
        assert sum(any(_summary(m) for m in b["messages"]) for b in chats) >= len(turns)
    for rec in turns:
        _not_a_breaker(rec)
    # the turns after a compaction keep Codex's instructions and tools: served from cache
    assert hit_rate(turns) > 0.5
    _no_breaker(s)


def _asks(rec) -> bool:
    """A request for a summary: the gateway's (a compaction_trigger) or Codex's own (its
    checkpoint prompt as the last input item)."""
    if holds(rec, ":compaction_trigger"):
        return True
    last = rec.segments_in[-1] if rec.segments_in else None
    return last is not None and "CONTEXT CHECKPOINT COMPACTION" in (rec.texts or {}).get(
        last.hash, ""
    )


def _summary(message: dict) -> bool:
    content = message.get("content")
    return isinstance(content, str) and content.startswith(SUMMARY_HEAD)
