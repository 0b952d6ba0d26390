"""Fixes and what they would give: replay the captured prompts through the cache model.

Each request's upstream prompt (``segments_out``) becomes a pseudo-token sequence: one run
of deterministic token ids per segment, derived from the segment's hash (equal segments
give equal tokens, so equal prefixes hit), as long as the segment's estimated tokens
scaled by the slice's ratio ``Σ prompt_tokens / Σ estimated tokens`` (one ratio for the
slice, so a segment has the same length in every request). The requests run in time
order through ``PrefixCache(block_size, capacity_tokens=None)`` — an upstream that
never evicts, i.e. the best the prompts allow.

The replay as recorded is the calibration (how close the model gets to the measured rate);
the replay with the offending segment dropped or neutralised is the prediction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from prefixgate.cache import PrefixCache
from prefixgate.doctor import segments as sg
from prefixgate.doctor.findings import Finding, Table
from prefixgate.doctor.output import pct
from prefixgate.doctor.segments import Captured
from prefixgate.record.record import Segment
from prefixgate.record.segments import prefix_tokens

REPLAY_TOKEN_BUDGET = 6_000_000  # prompt tokens replayed (most recent whole sessions)

Unit = tuple[int, int]  # (key, estimated tokens)
Transform = Callable[[Captured], list[Unit]]


def key_of(*parts: str) -> int:
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 4


def units_as_sent(req: Captured) -> list[Unit]:
    return [(key_of(s.hash), s.tokens) for s in req.seg_out if s.kind != "tool"]


def _system_in(req: Captured) -> list[Segment]:
    return [s for s in req.seg_in if s.kind == "system"]


def _rebuild_system(req: Captured, out_seg: Segment, drop: str, keep_tokens: bool) -> Unit:
    """The upstream system segment that flattened the received system blocks, without
    ``drop`` (its tokens removed) or with ``drop`` made constant (``keep_tokens``)."""
    blocks = _system_in(req)
    kept = [s.hash for s in blocks if s.name != drop]
    gone = next((s for s in blocks if s.name == drop), None)
    if keep_tokens:
        return key_of("neutral", out_seg.name, drop, *kept), out_seg.tokens
    tokens = out_seg.tokens - (gone.tokens if gone else 0)
    return key_of("system", *kept), max(tokens, 0)


def without_segment(in_name: str, out_name: str, *, neutralise: bool = False) -> Transform:
    """Drop (or make constant) the received segment ``in_name``: directly when it went
    upstream as its own segment, else inside the upstream segment ``out_name`` that holds
    it (the flattened system prompt)."""

    def apply(req: Captured) -> list[Unit]:
        target = next((s for s in req.seg_in if s.name == in_name), None)
        if target is None:
            return units_as_sent(req)
        out: list[Unit] = []
        for s in req.seg_out:
            if s.kind == "tool":
                continue
            if s.hash == target.hash:
                if neutralise:
                    out.append((key_of("neutral", in_name), s.tokens))
                continue
            if s.name == out_name or (s.kind == "system" and out_name is None):
                out.append(_rebuild_system(req, s, in_name, neutralise))
                continue
            out.append((key_of(s.hash), s.tokens))
        return out

    return apply


def system_in_place(req: Captured) -> list[Unit]:
    """The upstream prompt with the received system blocks as the system prompt and every
    message (mid-conversation system messages included) where the client put it."""
    out: list[Unit] = []
    system_done = messages_done = False
    sys_blocks = _system_in(req)
    messages = [(key_of(s.hash), s.tokens) for s in req.seg_in if s.kind == "message"]
    for s in req.seg_out:
        if s.kind == "tool":
            continue
        if s.kind == "system":
            if not system_done:
                out.append(
                    (
                        key_of("system", *(b.hash for b in sys_blocks)),
                        sum(b.tokens for b in sys_blocks),
                    )
                )
                system_done = True
        elif s.kind == "message":
            if not messages_done:
                out.extend(messages)
                messages_done = True
        else:
            out.append((key_of(s.hash), s.tokens))
    if not messages_done:
        out.extend(messages)
    return out


def sorted_tools(req: Captured) -> list[Unit]:
    tool_hashes = sorted(s.hash for s in req.seg_out if s.kind == "tool")
    return [
        (key_of("tools", *tool_hashes), s.tokens)
        if s.kind == "tools"
        else (key_of(s.hash), s.tokens)
        for s in req.seg_out
        if s.kind != "tool"
    ]


def neutralised(out_name: str) -> Transform:
    """The upstream segment ``out_name`` made constant in every request (its length
    kept): what the prompt gives once the value that changes in it is stable. A single
    tool stands for the whole tool list, which is one run in the replay."""

    def apply(req: Captured) -> list[Unit]:
        tool = any(s.kind == "tool" and s.name == out_name for s in req.seg_out)
        target = "tools" if tool else out_name
        return [
            (key_of("neutral", s.name), s.tokens)
            if s.name == target
            else (key_of(s.hash), s.tokens)
            for s in req.seg_out
            if s.kind != "tool"
        ]

    return apply


def transform_for(report: sg.SegmentReport) -> Transform | None:
    """The replayable fix for a diagnosed cause (None when there is none to replay)."""
    cause, in_name, out_name = report.cause, report.in_segment, report.first_unstable
    if cause == sg.BILLING and in_name:
        return without_segment(in_name, out_name or "")
    if cause == sg.HOISTED:
        return system_in_place
    if cause == sg.REORDERED:
        return sorted_tools
    if cause in (sg.TIMESTAMP, sg.UNKNOWN) and in_name and report.first_unstable_kind == "system":
        return without_segment(in_name, out_name or "", neutralise=True)
    return None


def fix_advice(cause: str | None, channel: str | None, volatility: str | None) -> list[str]:
    ch = channel or "(its channel)"
    if cause == sg.BILLING:
        return [
            f"enable `strip_anthropic_billing_header: true` on channel {ch} "
            "(drops the `x-anthropic-billing-header:` system block on Messages → OpenAI "
            "conversion; never for the vendor's own API, which reads it)",
            "or on every Claude Code client: `CLAUDE_CODE_ATTRIBUTION_HEADER=0`",
        ]
    if cause == sg.HOISTED:
        return [
            "keep mid-conversation `role: system` messages in place instead of hoisting them "
            "into the top system prompt (prefixgate's converter keeps them; check what "
            f"rewrites the request before channel {ch}: another proxy, a plugin, an older gateway)",
        ]
    if cause == sg.TIMESTAMP:
        return [
            "take the date/time out of the system prompt (put it in the latest user message) "
            "or round it to the day, in the client or agent that templates it",
        ]
    if cause == sg.REORDERED:
        return [
            "send the tools in a stable order (e.g. sorted by name) from the client or the MCP "
            "aggregator that builds the list",
        ]
    if cause == sg.COMPACTION:
        return [
            "compaction restarts the history by design; make it rarer: `input_tokens` must "
            f"exclude cached tokens (`anthropic_messages_exclude_cache: true` on {ch})",
        ]
    if cause == sg.TOOLS_CHANGED:
        return [
            "the tool set changes between turns: find the client/MCP server that adds tools late"
        ]
    return [
        "the segment named above changes; capture texts (`capture_text: true` on channel "
        f"{ch}) to see what varies, then make it stable or move it after the history",
    ]


@dataclass
class Replay:
    requests: int
    prompt_tokens: int
    cached_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class Prediction:
    block_size: int
    requests: int
    measured_rate: float  # of the replayed requests, as recorded
    replay_as_sent: float  # the model on the prompts as sent (calibration)
    predicted_rate: float  # the model with the fix applied
    calibration_points: float  # replay_as_sent − measured, in points

    def as_dict(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "requests": self.requests,
            "measured_rate": round(self.measured_rate, 6),
            "replay_as_sent": round(self.replay_as_sent, 6),
            "predicted_rate": round(self.predicted_rate, 6),
            "calibration_points": round(self.calibration_points, 2),
        }


def recent(reqs: Sequence[Captured], budget: int = REPLAY_TOKEN_BUDGET) -> list[Captured]:
    """Whole sessions, most recent first, while their prompts fit the replay budget (at
    least one session); returned oldest first. Requests without a session count alone."""
    groups: dict[object, list[Captured]] = {}
    for i, r in enumerate(reqs):
        groups.setdefault(r.session_id if r.session_id is not None else ("request", i), []).append(
            r
        )
    chosen: list[Captured] = []
    total = 0
    for members in sorted(groups.values(), key=lambda g: -max(r.received_at for r in g)):
        size = sum(r.prompt_tokens for r in members)
        if chosen and total + size > budget:
            continue
        chosen += members
        total += size
    return sorted(chosen, key=lambda r: r.received_at)


def replay(
    reqs: Sequence[Captured], block_size: int, units_of: Transform = units_as_sent
) -> Replay:
    ordered = sorted(reqs, key=lambda r: r.received_at)
    est = sum(prefix_tokens(r.seg_out) for r in ordered)
    ratio = sum(r.prompt_tokens for r in ordered) / est if est else 1.0
    cache = PrefixCache(block_size=block_size, capacity_tokens=None)
    runs: dict[tuple[int, int], np.ndarray] = {}
    prompt = cached = 0
    for r in ordered:
        parts = []
        for key, tokens in units_of(r):
            n = round(tokens * ratio)
            if n <= 0:
                continue
            arr = runs.get((key, n))
            if arr is None:
                base = (key & ((1 << 40) - 1)) << 20
                arr = runs[(key, n)] = base + np.arange(n, dtype=np.int64) % (1 << 20)
            parts.append(arr)
        if not parts:
            continue
        tokens_arr = np.concatenate(parts)[: max(r.prompt_tokens, 1)]
        result = cache.process(tokens_arr)
        prompt += result.prompt_tokens
        cached += result.cached_tokens
    return Replay(len(ordered), prompt, cached)


def predict(reqs: Sequence[Captured], block_size: int, fix: Transform) -> Prediction:
    sample = recent(reqs)
    measured_prompt = sum(r.prompt_tokens for r in sample)
    measured = sum(r.cached_tokens for r in sample) / measured_prompt if measured_prompt else 0.0
    base = replay(sample, block_size)
    fixed = replay(sample, block_size, fix)
    return Prediction(
        block_size,
        len(sample),
        measured,
        base.hit_rate,
        fixed.hit_rate,
        (base.hit_rate - measured) * 100,
    )


def summarize(f: Finding, p: Prediction | None) -> None:
    """The prediction on a finding: one line and the replay table."""
    if p is None:
        return
    f.summary.append(
        f"predicted hit rate after the fix: {pct(p.predicted_rate)} (replay of {p.requests:,} captured "
        f"prompts, block {p.block_size}; the same replay as sent gives {pct(p.replay_as_sent)} vs "
        f"{pct(p.measured_rate)} measured: calibration {p.calibration_points:+.1f} points)"
    )
    f.evidence.append(
        Table(
            "replay through the cache model",
            ["replay", "hit rate"],
            [
                ["measured (as recorded)", pct(p.measured_rate)],
                ["model, prompts as sent", pct(p.replay_as_sent)],
                ["model, fix applied", pct(p.predicted_rate)],
            ],
        )
    )
