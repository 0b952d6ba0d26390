"""Whole traffic: sessions apportioned by ``mix``, generated, and interleaved into one
deterministic order."""

from __future__ import annotations

import hashlib
import random
from collections import deque
from collections.abc import Sequence

from .claude_code import ClaudeCodeSession
from .spec import AGENT_CLAUDE_CODE, AGENT_STABLE_OPENAI, AGENTS, SimRequest, TrafficSpec
from .stable import StableAgentSession
from .text import derive


def _apportion(n: int, mix: dict[str, float]) -> list[str]:
    kinds = [k for k in AGENTS if mix.get(k, 0) > 0]
    total = sum(mix[k] for k in kinds)
    exact = {k: n * mix[k] / total for k in kinds}
    counts = {k: int(exact[k]) for k in kinds}
    rest = n - sum(counts.values())
    for k in sorted(kinds, key=lambda k: (-(exact[k] - counts[k]), AGENTS.index(k)))[:rest]:
        counts[k] += 1
    return [k for k in kinds for _ in range(counts[k])]


def make_sessions(spec: TrafficSpec) -> list[ClaudeCodeSession | StableAgentSession]:
    """The sessions of ``spec`` (kinds apportioned by ``mix``, order shuffled by the seed)."""
    rng = random.Random(derive("mix", spec.seed))
    kinds = _apportion(spec.sessions, spec.mix) if spec.sessions else []
    rng.shuffle(kinds)
    users = spec.users
    out: list[ClaudeCodeSession | StableAgentSession] = []
    for i, kind in enumerate(kinds):
        seed = derive("session", spec.seed, i)
        if kind == AGENT_CLAUDE_CODE:
            device = None
            if users:
                k = rng.randrange(users)
                device = hashlib.sha256(f"device|{spec.seed}|{k}".encode()).hexdigest()
            out.append(ClaudeCodeSession(spec, seed, device_id=device))
        else:
            api = "openai" if kind == AGENT_STABLE_OPENAI else "anthropic"
            out.append(StableAgentSession(spec, seed, api=api))
    return out


def generate(spec: TrafficSpec) -> list[list[SimRequest]]:
    """All requests of ``spec``, one list per session, each in the session's own order."""
    return [list(s.requests()) for s in make_sessions(spec)]


def interleave(
    sessions: Sequence[Sequence[SimRequest]], seed: int, concurrency: int | None = None
) -> list[SimRequest]:
    """A deterministic global order that keeps each session's own order.

    With ``concurrency`` at most that many sessions are open at once (a new one starts when
    one finishes, in list order); each step picks one open session at random.
    """
    rng = random.Random(derive("interleave", seed))
    pending = deque(i for i, s in enumerate(sessions) if s)
    limit = concurrency if concurrency and concurrency > 0 else len(sessions)
    active: list[int] = []
    pos = [0] * len(sessions)
    out: list[SimRequest] = []
    while pending or active:
        while pending and len(active) < limit:
            active.append(pending.popleft())
        k = rng.randrange(len(active))
        i = active[k]
        out.append(sessions[i][pos[i]])
        pos[i] += 1
        if pos[i] == len(sessions[i]):
            active.pop(k)
    return out


def traffic(spec: TrafficSpec) -> list[SimRequest]:
    """``interleave(generate(spec), spec.seed, spec.concurrency)``."""
    return interleave(generate(spec), spec.seed, spec.concurrency)
