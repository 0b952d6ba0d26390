"""Hand-made records for the doctor's tests: sessions built from segments, their
``cached_tokens`` computed by an independent replay through the cache model."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from prefixgate.cache import PrefixCache
from prefixgate.record.record import Record, Segment
from prefixgate.store import open_store

CHANNEL = "h200-vllm"
UPSTREAM = "deepseek-v4-flash-0731"
BLOCK = 64
T0 = 1786924800.0  # 2026-08-17 00:00 UTC


def h(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


@dataclass
class Part:
    """A segment with its text (the canonical JSON a capture would store)."""

    kind: str
    name: str
    text: str
    tokens: int | None = None

    def segment(self) -> Segment:
        tokens = self.tokens if self.tokens is not None else (len(self.text) + 3) // 4
        return Segment(self.kind, self.name, h(self.text), max(len(self.text), tokens * 4), tokens)


def block_text(text: str) -> str:
    return json.dumps({"text": text, "type": "text"}, sort_keys=True, separators=(",", ":"))


def message_text(role: str, content: str) -> str:
    return json.dumps({"content": content, "role": role}, sort_keys=True, separators=(",", ":"))


@dataclass
class Request:
    seg_in: list[Part]
    seg_out: list[Part]
    fields: dict = field(default_factory=dict)


def record(
    req: Request,
    *,
    rid: str,
    at: float,
    session: str | None,
    texts: bool = False,
    **fields,
) -> Record:
    seg_in = [p.segment() for p in req.seg_in]
    seg_out = [p.segment() for p in req.seg_out]
    rec = Record(
        request_id=rid,
        received_at=at,
        session_id=session,
        status=200,
        channel=CHANNEL,
        upstream_model=UPSTREAM,
        segments_in=seg_in,
        segments_out=seg_out,
        **{**req.fields, **fields},
    )
    if texts:
        rec.texts = {
            s.hash: p.text for s, p in zip(seg_in + seg_out, req.seg_in + req.seg_out, strict=True)
        }
    return rec


def simulate(records: Sequence[Record], block: int = BLOCK) -> list[Record]:
    """Fill prompt_tokens and cached_tokens as an upstream with an unbounded prefix cache
    would (per channel), from each record's upstream segments."""
    caches: dict[str | None, PrefixCache] = {}
    for rec in sorted(records, key=lambda r: r.received_at):
        parts = []
        for s in rec.segments_out or []:
            if s.kind == "tool":
                continue
            base = int(s.hash[:8], 16) << 24
            parts.append(base + np.arange(s.tokens, dtype=np.int64))
        tokens = np.concatenate(parts)
        cache = caches.setdefault(rec.channel, PrefixCache(block_size=block))
        res = cache.process(tokens)
        rec.prompt_tokens = res.prompt_tokens
        if rec.cached_tokens is None:
            rec.cached_tokens = res.cached_tokens
    return list(records)


def write(dsn: str, records: Sequence[Record]) -> str:
    with open_store(dsn) as store:
        store.migrate()
        store.write_batch(list(records))
    return dsn


# -- Claude Code-like Messages sessions, converted for an OpenAI upstream ----------------

TOOLS_TOKENS = 17950  # 280 full blocks of 64 → a pinned 17920


def claude_request(
    *,
    header: str | None,
    history: list[tuple[str, str, int]],
    system_messages: Sequence[tuple[int, str]] = (),
    hoist: bool = False,
    tools_first: bool = True,
    tools_tokens: int = TOOLS_TOKENS,
) -> Request:
    """One Claude Code request: system = [header?, identity, main prompt], 23 tools, the
    history (role, text, tokens). ``system_messages`` are (position, text) role-system
    messages in the history; ``hoist`` puts them into the upstream system prompt."""
    system = ([block_text(header)] if header is not None else []) + [
        block_text("You are Claude Code, Anthropic's official CLI for Claude."),
        block_text("Main system prompt: workspace, branch, git status snapshot. " * 20),
    ]
    tools = [json.dumps({"name": f"tool{i}", "input_schema": {"i": i}}) for i in range(23)]
    seg_in = [Part("system", f"system[{i}]", t) for i, t in enumerate(system)]
    seg_in.append(Part("tools", "tools", "[" + ",".join(tools) + "]", tools_tokens))
    seg_in += [Part("tool", f"tool{i}", t, tools_tokens // 23) for i, t in enumerate(tools)]
    msgs = [(role, text, tokens) for role, text, tokens in history]
    for pos, text in system_messages:
        msgs.insert(pos, ("system", text, (len(text) + 3) // 4))
    seg_in += [
        Part("message", f"messages[{i}]:{r}", message_text(r, t), n)
        for i, (r, t, n) in enumerate(msgs)
    ]
    # upstream (OpenAI chat): tools, one flattened system message, the messages
    flat = "".join(json.loads(t)["text"] for t in system)
    out_msgs = msgs
    if hoist:
        flat += "".join(t for r, t, _ in msgs if r == "system")
        out_msgs = [m for m in msgs if m[0] != "system"]
    sys_tokens = sum(p.segment().tokens for p in seg_in if p.kind == "system")
    if hoist:
        sys_tokens += sum(n for r, _, n in msgs if r == "system")
    sys_part = Part("system", "messages[0]:system", message_text("system", flat), sys_tokens)
    tools_out = Part("tools", "tools", "openai:" + ",".join(tools), tools_tokens + 30)
    tool_out = [
        Part("tool", f"tool{i}", "openai:" + t, tools_tokens // 23) for i, t in enumerate(tools)
    ]
    head = [tools_out, *tool_out, sys_part] if tools_first else [sys_part, tools_out, *tool_out]
    seg_out = head + [
        Part("message", f"messages[{i + 1}]:{r}", "openai:" + message_text(r, t), n)
        for i, (r, t, n) in enumerate(out_msgs)
    ]
    return Request(
        seg_in,
        seg_out,
        {
            "endpoint": "messages",
            "client": "claude-cli",
            "session_kind": "claude-code",
            "requested_model": "llm-prime",
        },
    )


def claude_sessions(
    n_sessions: int,
    turns: Callable[[int], int],
    *,
    header: Callable[[int, int], str | None],
    first_tokens: int = 20000,
    growth: int = 20000,
    start: float = T0 + 9 * 3600,
    texts: bool = False,
    prefix: str = "cc",
    system_messages: Callable[[int, int], list[tuple[int, str]]] | None = None,
    hoist: bool = False,
    tools_first: bool = True,
) -> list[Record]:
    out = []
    for s in range(n_sessions):
        sid = f"{prefix}-session-{s}"
        history = [("user", f"summary of an earlier conversation {s}", first_tokens)]
        for t in range(turns(s)):
            req = claude_request(
                header=header(s, t),
                history=history,
                system_messages=system_messages(s, t) if system_messages else (),
                hoist=hoist,
                tools_first=tools_first,
            )
            at = start + s * 7.0 + t * 600.0 + (s % 3)
            out.append(record(req, rid=f"{sid}-{t}", at=at, session=sid, texts=texts))
            history = history + [
                ("assistant", f"answer {s}.{t}", growth // 2),
                ("user", f"question {s}.{t + 1}", growth - growth // 2),
            ]
    return out


def cch(s: int, t: int) -> str:
    value = hashlib.sha256(f"{s}/{t}".encode()).hexdigest()[:5]
    return f"x-anthropic-billing-header: cc_version=2.1.116.d8c; cc_entrypoint=claude-vscode; cch={value};"


def per_session_header(s: int, t: int) -> str:
    suffix = hashlib.sha256(f"{s}".encode()).hexdigest()[:3]
    return f"x-anthropic-billing-header: cc_version=2.1.332.{suffix}; cc_entrypoint=sdk-cli;"


# -- a stable-prefix OpenAI agent (the control group) ---------------------------------


def chat_request(
    *,
    system: str,
    tools: Sequence[str],
    history: list[tuple[str, str, int]],
    tools_tokens: int = 6000,
    client: str = "reasonix",
    requested_model: str = UPSTREAM,
) -> Request:
    tool_parts = [
        Part("tool", f"t{i}", t, tools_tokens // max(len(tools), 1)) for i, t in enumerate(tools)
    ]
    tools_part = Part("tools", "tools", "[" + ",".join(tools) + "]", tools_tokens)
    sys_part = Part("system", "messages[0]:system", message_text("system", system))
    msgs = [
        Part("message", f"messages[{i + 1}]:{r}", message_text(r, t), n)
        for i, (r, t, n) in enumerate(history)
    ]
    segs = [tools_part, *tool_parts, sys_part, *msgs]
    return Request(
        segs,
        list(segs),
        {
            "endpoint": "chat",
            "client": client,
            "session_kind": "openai-user",
            "requested_model": requested_model,
        },
    )


STABLE_TOOLS = [json.dumps({"type": "function", "function": {"name": f"fn{i}"}}) for i in range(8)]


def chat_sessions(
    n_sessions: int,
    turns: int,
    *,
    system: Callable[[int, int], str] = lambda s, t: "You are Reasonix, a coding agent.",
    tools: Callable[[int, int], Sequence[str]] = lambda s, t: STABLE_TOOLS,
    first_tokens: int = 30000,
    growth: int = 15000,
    start: float = T0 + 9 * 3600 + 3,
    client: str = "reasonix",
    prefix: str = "rx",
    texts: bool = False,
    requested_model: str = UPSTREAM,
) -> list[Record]:
    out = []
    for s in range(n_sessions):
        sid = f"{prefix}-session-{s}"
        history = [("user", f"task {prefix} {s}", first_tokens)]
        for t in range(turns):
            req = chat_request(
                system=system(s, t),
                tools=tools(s, t),
                history=history,
                client=client,
                requested_model=requested_model,
            )
            at = start + s * 11.0 + t * 500.0
            out.append(record(req, rid=f"{sid}-{t}", at=at, session=sid, texts=texts))
            history = history + [
                ("assistant", f"reply {s}.{t}", growth // 2),
                ("user", f"next {s}.{t + 1}", growth - growth // 2),
            ]
    return out
