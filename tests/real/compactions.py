"""Long sessions that compact: the real Claude Code and Codex CLIs through the gateway
until their context fills, then on. Shared by ``test_compaction.py`` (which asserts on
them) and ``benchmarks/compaction.py`` (which prints their figures for
``docs/diagnostics.md``).

- **Claude Code** against an engine whose window its conversation overflows: the engine
  refuses the prompt, the gateway answers Anthropic's ``prompt is too long: N tokens > M
  maximum``, the CLI compacts (a summary request) and retries from the summary; a last
  ``--continue`` turn goes on from there.
- **Codex** with an auto-compaction limit just above its first prompt: before each later
  turn it compacts, through the gateway's Responses compaction (a provider it takes for
  Azure's, ``name = "azure"``: a ``compaction_trigger`` request, then a ``compaction``
  item in every later request) or by a summary turn of its own (any other provider).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from prefixgate.lab.traffic.template_sessions import wait_stored
from tests.conftest import settled
from tests.real.agents import Claude, Codex, stack

NOTE_WORDS = ("red", "green", "blue", "cyan", "black", "white", "alpha", "beta", "gamma")
# Codex compacts once the thread's tokens pass this: just above its first prompt
# (instructions and tools, ~11k tokens), so every later turn begins with a compaction.
CODEX_COMPACT_LIMIT = 12_000


def notes(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return "Read these notes and reply OK.\n" + " ".join(rng.choice(NOTE_WORDS) for _ in range(n))


@dataclass
class Session:
    """What the gateway recorded of one CLI session (its conversation requests, in order)
    and what it sent upstream, with the CLI's own outputs."""

    records: list
    chats: list[dict]  # the upstream's view: path, status, body
    outputs: list = field(default_factory=list)
    ledgers: list = field(default_factory=list)
    dsn: str = ""


def _collect(s, endpoint: str, outputs: list) -> Session:
    """Once every request is in the store, and the ledger of every answered one."""
    gateway = s.app.state.gateway
    settled(gateway)
    writer, deadline = gateway.recorder, time.monotonic() + 60
    # every record submitted written (a CLI's last answer goes out before its record is)
    while (st := writer.stats()).written + st.dropped + st.rejected < st.submitted:
        assert time.monotonic() < deadline, f"records not written: {st}"
        time.sleep(0.05)
    total = st.written
    while len(recs := s.records(endpoint)) < total:  # a refused request has no ledger
        assert time.monotonic() < deadline, f"{len(recs)} of {total} records stored"
        time.sleep(0.05)
    wait_stored(s.app, sum(r.status == 200 for r in recs) or 1)
    return Session(recs, s.upstream.chats(), outputs, s.ledgers(recs), s.dsn)


def claude_overflows(exe: Path, vllm, tmp_path: Path, *, words: int = 7000) -> Session:
    """Three turns: two of notes (the second overflows the window), one short."""
    env = {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256"}  # the window it cannot know: 200000
    with stack(tmp_path, vllm_url=vllm.url, model=vllm.served_model) as s:
        cli = Claude(exe, s, tmp_path, **env)
        outs = [
            cli.run(notes(1, words)),
            cli.run(notes(2, words), resume=True),
            cli.run("and once more", resume=True),
        ]
        return _collect(s, "messages", outs)


def codex_compacts(exe: Path, vllm, tmp_path: Path, *, name: str, turns: int = 3) -> Session:
    """``turns`` turns of a short question; Codex compacts before each after the first."""
    top = f"model_context_window = {vllm.max_model_len}\n"
    top += f"model_auto_compact_token_limit = {CODEX_COMPACT_LIMIT}\n"
    with stack(tmp_path, vllm_url=vllm.url, model=vllm.served_model) as s:
        cli = Codex(exe, s, tmp_path, name=name, top=top)
        outs = [cli.run(notes(t, 300), resume=t > 0) for t in range(turns)]
        return _collect(s, "responses", outs)


def holds(rec, suffix: str) -> bool:
    """The request as received has a segment whose name ends with ``suffix``."""
    return any(seg.name.endswith(suffix) for seg in rec.segments_in or ())


def hit_rate(recs) -> float:
    return sum(r.cached_tokens or 0 for r in recs) / max(1, sum(r.prompt_tokens for r in recs))
