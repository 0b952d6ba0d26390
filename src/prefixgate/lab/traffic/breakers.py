"""Claude-Code-like sessions with one known cache breaker each: the doctor's test bench.

Every case is Claude Code's request shape (:class:`~.claude_code.ClaudeCodeSession`: its
tools, its system blocks, a ``role: system`` environment message at ``messages[1]``, the
moving ``cache_control`` marker), all from one client version, without the billing header
(as with ``CLAUDE_CODE_ATTRIBUTION_HEADER=0``) unless the case is the header; then one
thing varies as a real client or agent framework makes it vary:

========================  =================================================================
``control``               nothing: a byte-stable prefix, an append-only history
``billing_header``        ``system[0]`` is the billing header with a per-request ``cch=``
``clock``                 a time of day (``Current time: HH:MM:SS``) after the first
                          paragraph of the main system prompt, new every request
``mid_conversation_date`` the first line of the mid-conversation system message is a date
                          that moves on every request (a resumed, day-by-day session)
``tools_reordered``       the same tools, in another order every request
``session_uuid``          a per-session UUID in the main system prompt (stable in a
                          session, different across sessions)
``schema_key_order``      one tool's ``input_schema`` serialized with its keys in another
                          order every other request (same JSON value)
========================  =================================================================

:data:`EXPECTED` says what the doctor must name for each: the class of the change and the
received segment it is in.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .claude_code import BILLING_PREFIX, ClaudeCodeSession
from .spec import SimRequest, TrafficSpec
from .text import derive, hex_digits, uuid4

CONTROL = "control"
BILLING = "billing_header"
CLOCK = "clock"
MID_DATE = "mid_conversation_date"
TOOLS_REORDERED = "tools_reordered"
SESSION_UUID = "session_uuid"
KEY_ORDER = "schema_key_order"
CASES = (CONTROL, BILLING, CLOCK, MID_DATE, TOOLS_REORDERED, SESSION_UUID, KEY_ORDER)


@dataclass(frozen=True)
class Expected:
    """What the doctor must say about a case: the class of the change, the received
    segment it is in, and whether it changes within sessions or only across them."""

    cls: str | None
    segment: str | None
    scope: str = "session"


EXPECTED: dict[str, Expected] = {
    CONTROL: Expected(None, None),
    BILLING: Expected("nonce", "system[0]"),
    CLOCK: Expected("time_of_day", "system[1]"),
    MID_DATE: Expected("date", "messages[1]:system"),
    TOOLS_REORDERED: Expected("reordered_list", "tools"),
    SESSION_UUID: Expected("uuid", "system[1]", "sessions"),
    KEY_ORDER: Expected("serialization", "Edit"),
}

_START = dt.datetime(2026, 8, 17, 9, 12, 5)


def spec_for(sessions: int = 4, turns: int = 6, seed: int = 11, **kw: Any) -> TrafficSpec:
    """The traffic every case starts from: Claude Code sessions of one version, no
    titles, no compaction (each case isolates one breaker)."""
    return TrafficSpec(
        sessions=sessions,
        turns=turns,
        seed=seed,
        cch=False,
        titles=False,
        compact_chars=0,
        mix={"claude-code": 1.0},
        **kw,
    )


def sessions(case: str, spec: TrafficSpec) -> list[list[SimRequest]]:
    """The case's sessions, each a list of requests in order."""
    if case not in CASES:
        raise ValueError(f"unknown case {case!r}; one of {', '.join(CASES)}")
    out = []
    for s in range(spec.sessions):
        seed = int(derive(f"breakers|{case}", spec.seed * 1000 + s))
        base = ClaudeCodeSession(spec, seed)
        out.append(list(_apply(case, base, seed)))
    return out


def _apply(case: str, base: ClaudeCodeSession, seed: int) -> Iterator[SimRequest]:
    rng = random.Random(derive("breakers-rng", seed))
    session_uuid = uuid4(rng)
    change: Callable[[dict, int], None] = _CHANGES[case]
    for req in base.requests():
        body = req.fresh_body()
        if case != BILLING:
            body["system"] = body["system"][1:]  # no billing header
        change(body, req.seq, rng=rng, session_uuid=session_uuid)  # type: ignore[call-arg]
        yield SimRequest(
            req.endpoint,
            req.headers,
            body,
            req.session_id,
            req.turn,
            req.kind,
            req.agent,
            req.seq,
            req.epoch,
        )


def _nothing(body: dict, seq: int, **_: Any) -> None:
    pass


def _billing(body: dict, seq: int, *, rng: random.Random, **_: Any) -> None:
    block = body["system"][0]
    assert block["text"].startswith(BILLING_PREFIX)
    block["text"] += f" cch={hex_digits(rng, 5)};"


def _after_first_paragraph(text: str, line: str) -> str:
    head, sep, rest = text.partition("\n\n")
    return f"{head}\n\n{line}{sep}{rest}" if sep else f"{text}\n\n{line}"


def _clock(body: dict, seq: int, **_: Any) -> None:
    block = body["system"][-1]
    now = _START + dt.timedelta(seconds=37 * seq + 3)
    block["text"] = _after_first_paragraph(block["text"], f"Current time: {now:%H:%M:%S}")


def _mid_date(body: dict, seq: int, **_: Any) -> None:
    env = body["messages"][1]
    assert env["role"] == "system"
    day = (_START + dt.timedelta(days=seq)).date().isoformat()
    block = env["content"][0]
    env["content"] = [{**block, "text": f"Date: {day}\n{block['text']}"}]


def _tools_reordered(body: dict, seq: int, *, rng: random.Random, **_: Any) -> None:
    tools = list(body["tools"])
    rng.shuffle(tools)
    body["tools"] = tools


def _session_uuid(body: dict, seq: int, *, session_uuid: str, **_: Any) -> None:
    block = body["system"][-1]
    block["text"] = _after_first_paragraph(block["text"], f"Session: {session_uuid}")


def _key_order(body: dict, seq: int, **_: Any) -> None:
    tools = list(body["tools"])
    i = next(k for k, t in enumerate(tools) if t["name"] == "Edit")
    tool = dict(tools[i])
    schema = tool["input_schema"]
    if seq % 2:
        tool["input_schema"] = dict(reversed(list(schema.items())))
    tools[i] = tool
    body["tools"] = tools


_CHANGES: dict[str, Callable[..., None]] = {
    CONTROL: _nothing,
    BILLING: _billing,
    CLOCK: _clock,
    MID_DATE: _mid_date,
    TOOLS_REORDERED: _tools_reordered,
    SESSION_UUID: _session_uuid,
    KEY_ORDER: _key_order,
}

__all__ = ["CASES", "EXPECTED", "Expected", "sessions", "spec_for"]
