"""What to generate and what comes out: agent kinds, request kinds, endpoints,
:class:`TrafficSpec` and :class:`SimRequest`."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from .text import dumps

AGENT_CLAUDE_CODE = "claude-code"
AGENT_STABLE_OPENAI = "stable-openai"
AGENT_STABLE_ANTHROPIC = "stable-anthropic"
AGENTS = (AGENT_CLAUDE_CODE, AGENT_STABLE_OPENAI, AGENT_STABLE_ANTHROPIC)

KIND_TURN = "turn"
KIND_COMPACT = "compact"
KIND_TITLE = "title"

MESSAGES_ENDPOINT = "/v1/messages?beta=true"
STABLE_MESSAGES_ENDPOINT = "/v1/messages"
CHAT_ENDPOINT = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request as a client would send it.

    ``endpoint`` is the path with query string; ``kind`` is ``"turn"``, ``"compact"`` or
    ``"title"``; ``agent`` is one of :data:`AGENTS`; ``turn`` is the agent turn the
    request belongs to (a compaction carries the turn it precedes, a title turn 0); ``seq``
    is the position within the session; ``epoch`` counts the compactions before it.
    """

    endpoint: str
    headers: dict[str, str]
    body: dict[str, Any]
    session_id: str
    turn: int
    kind: str
    agent: str = AGENT_CLAUDE_CODE
    seq: int = 0
    epoch: int = 0

    @property
    def path(self) -> str:
        return self.endpoint.split("?", 1)[0]

    def body_json(self) -> str:
        return dumps(self.body)

    def content(self) -> bytes:
        """The body as the client puts it on the wire."""
        return self.body_json().encode()

    def fresh_body(self) -> dict[str, Any]:
        """A private deep copy of the body (bodies share read-only parts)."""
        return copy.deepcopy(self.body)


@dataclass
class TrafficSpec:
    """What to generate. ``mix`` maps agent kinds (:data:`AGENTS`) to weights; sessions are
    apportioned to kinds by largest remainder. ``compact_chars`` is the compact-JSON size of
    ``messages`` above which a session compacts (0 disables). ``users`` is the number of
    distinct devices sessions are spread over (0: one per session)."""

    sessions: int = 8
    turns: int = 20
    concurrency: int = 4
    seed: int = 0
    cc_version: str = "2.1.332"
    cc_entrypoint: str = "cli"
    cch: bool = False
    tools_kb: float = 70.0
    system_kb: float = 6.0
    tool_result_chars: tuple[int, int] = (200, 12000)
    compact_chars: int = 480_000
    models: tuple[str, ...] = ("claude-opus-4-8",)
    stable_models: tuple[str, ...] = ("deepseek-v4-flash",)
    mix: dict[str, float] = field(
        default_factory=lambda: {AGENT_CLAUDE_CODE: 0.5, AGENT_STABLE_OPENAI: 0.5}
    )
    titles: bool = True
    mid_system: bool = True
    stable_version: str = "1.0.114"
    stable_tools_kb: float = 24.0
    stable_system_kb: float = 3.0
    max_tokens: int = 32000
    api_key: str = "sim-key"
    users: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.mix) - set(AGENTS)
        if unknown:
            raise ValueError(f"unknown agent kinds in mix: {sorted(unknown)}")
        if self.sessions < 0 or self.turns < 1:
            raise ValueError("sessions must be >= 0 and turns >= 1")
        if any(w < 0 for w in self.mix.values()) or (self.sessions and not sum(self.mix.values())):
            raise ValueError("mix weights must be >= 0 with a positive sum")
        lo, hi = self.tool_result_chars
        if not 0 < lo <= hi:
            raise ValueError("tool_result_chars must be (lo, hi) with 0 < lo <= hi")
        if not self.models or not self.stable_models:
            raise ValueError("models and stable_models must not be empty")


def without_cache_control(obj: Any) -> Any:
    """A copy of ``obj`` with every ``cache_control`` key removed (for prefix comparisons)."""
    if isinstance(obj, dict):
        return {k: without_cache_control(v) for k, v in obj.items() if k != "cache_control"}
    if isinstance(obj, list):
        return [without_cache_control(v) for v in obj]
    return obj


def msg_size(msg: dict[str, Any]) -> int:
    return len(dumps(msg)) + 1
