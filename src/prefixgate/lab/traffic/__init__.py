"""Synthetic agent traffic, seeded and reproducible.

Two kinds of client are simulated, the two populations of the billing-header
incident:

- :class:`ClaudeCodeSession` - request bodies and headers in Claude Code's shape
  (``POST /v1/messages?beta=true``): ``system`` is three text blocks, the first being the
  billing header ``x-anthropic-billing-header: cc_version=<ver>.<3 hex>; cc_entrypoint=cli;``
  whose suffix changes per session and after every compaction (and, with ``cch=True``, a
  ``cch=<5 hex>;`` part that changes on every request); about 20 tools of ~70 KB JSON that
  are byte-identical for a version; a ``role: "system"`` message at ``messages[1]``; a
  ``cache_control`` marker that moves to the last block of the last message every turn;
  compaction requests that restart the history from a summary; optional title requests.
- :class:`StableAgentSession` - the control group (an opencode-like agent) with a
  byte-stable prefix: a fixed system prompt, the same tools every turn and an append-only
  history, as OpenAI Chat Completions (``/v1/chat/completions``) or, with
  ``api="anthropic"``, as a plain Anthropic Messages request (``/v1/messages``).

The assistant turns are fabricated by the generator, so a session never needs the
upstream's replies: its requests are a pure function of the seed. Everything is drawn from
``random.Random`` instances whose seeds are derived with SHA-256 (never the salted
``hash()``), so one :class:`TrafficSpec` gives byte-identical bodies in every process.

Request bodies share read-only sub-objects (the tools, the system prompt, earlier history
messages) between requests to keep generation fast. Do not mutate them in place; use
:meth:`SimRequest.fresh_body` for a private deep copy or :meth:`SimRequest.content` for
the bytes to send.

Example::

    spec = TrafficSpec(sessions=50, turns=20, seed=7, cch=True,
                       mix={"claude-code": 0.5, "stable-openai": 0.5})
    per_session = generate(spec)                 # list[list[SimRequest]]
    ordered = interleave(per_session, spec.seed, spec.concurrency)
    for req in ordered:
        client.post(req.endpoint, headers=req.headers, content=req.content())

Layout, one module per concept:

- :mod:`.spec` - agent and request kinds, endpoints, :class:`TrafficSpec`, :class:`SimRequest`;
- :mod:`.text` - seeded ids and seeds, compact JSON, the prose, code and log pools;
- :mod:`.prompts` - the system prompts and the compaction and title prompts;
- :mod:`.catalog` and :mod:`.tools` - the tool definitions and their rendering per API;
- :mod:`.dialogue` - the fabricated, format-neutral agent side of a conversation;
- :mod:`.claude_code` and :mod:`.stable` - the two session kinds;
- :mod:`.generate` - sessions by ``mix``, :func:`generate`, :func:`interleave`, :func:`traffic`.

The public names are re-exported here: ``from prefixgate.lab.traffic import ...``.
"""

from __future__ import annotations

# Outside ``__all__`` as before, but importable from here: the ``X as X`` re-exports.
from prefixgate.lab.traffic.claude_code import BILLING_PREFIX as BILLING_PREFIX
from prefixgate.lab.traffic.claude_code import ClaudeCodeSession, billing_header
from prefixgate.lab.traffic.generate import generate, interleave, make_sessions, traffic
from prefixgate.lab.traffic.prompts import COMPACT_PROMPT as COMPACT_PROMPT
from prefixgate.lab.traffic.prompts import IDENTITY_LINE as IDENTITY_LINE
from prefixgate.lab.traffic.prompts import TITLE_PROMPT as TITLE_PROMPT
from prefixgate.lab.traffic.prompts import claude_code_system_prompt, stable_system_prompt
from prefixgate.lab.traffic.spec import (
    AGENT_CLAUDE_CODE,
    AGENT_STABLE_ANTHROPIC,
    AGENT_STABLE_OPENAI,
    AGENTS,
    CHAT_ENDPOINT,
    KIND_COMPACT,
    KIND_TITLE,
    KIND_TURN,
    MESSAGES_ENDPOINT,
    STABLE_MESSAGES_ENDPOINT,
    SimRequest,
    TrafficSpec,
    without_cache_control,
)
from prefixgate.lab.traffic.stable import StableAgentSession
from prefixgate.lab.traffic.text import dumps
from prefixgate.lab.traffic.tools import claude_code_tools, stable_tools

__all__ = [
    "AGENTS",
    "AGENT_CLAUDE_CODE",
    "AGENT_STABLE_ANTHROPIC",
    "AGENT_STABLE_OPENAI",
    "CHAT_ENDPOINT",
    "KIND_COMPACT",
    "KIND_TITLE",
    "KIND_TURN",
    "MESSAGES_ENDPOINT",
    "STABLE_MESSAGES_ENDPOINT",
    "ClaudeCodeSession",
    "SimRequest",
    "StableAgentSession",
    "TrafficSpec",
    "billing_header",
    "claude_code_system_prompt",
    "claude_code_tools",
    "dumps",
    "generate",
    "interleave",
    "make_sessions",
    "stable_system_prompt",
    "stable_tools",
    "traffic",
    "without_cache_control",
]
