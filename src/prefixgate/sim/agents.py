"""Synthetic agent traffic, seeded and reproducible: the public names of
:mod:`prefixgate.sim.traffic` (read its docstring), re-exported in one place.

Example::

    spec = TrafficSpec(sessions=50, turns=20, seed=7, cch=True,
                       mix={"claude-code": 0.5, "stable-openai": 0.5})
    per_session = generate(spec)                 # list[list[SimRequest]]
    ordered = interleave(per_session, spec.seed, spec.concurrency)
    for req in ordered:
        client.post(req.endpoint, headers=req.headers, content=req.content())
"""

from __future__ import annotations

# Outside ``__all__`` as before, but importable from here: the ``X as X`` re-exports.
from prefixgate.sim.traffic.claude_code import BILLING_PREFIX as BILLING_PREFIX
from prefixgate.sim.traffic.claude_code import ClaudeCodeSession, billing_header
from prefixgate.sim.traffic.generate import generate, interleave, make_sessions, traffic
from prefixgate.sim.traffic.prompts import COMPACT_PROMPT as COMPACT_PROMPT
from prefixgate.sim.traffic.prompts import IDENTITY_LINE as IDENTITY_LINE
from prefixgate.sim.traffic.prompts import TITLE_PROMPT as TITLE_PROMPT
from prefixgate.sim.traffic.prompts import claude_code_system_prompt, stable_system_prompt
from prefixgate.sim.traffic.spec import (
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
from prefixgate.sim.traffic.stable import StableAgentSession
from prefixgate.sim.traffic.text import dumps
from prefixgate.sim.traffic.tools import claude_code_tools, stable_tools

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
