"""Absolute detection: a finding for every material breaker, with the hit rate the fix
would give (a replay of the captured prompts through the cache model), and the peer
comparison of slices only as corroboration.

A slice finding (a weak slice against its best peer) that names the same segment is the
same problem seen from the other side: the breaker is folded into it (its class, shape and
cost added) instead of being reported twice. A breaker no slice finding names — the
usual case when every session has it, so no slice is better than another — gets its own
finding.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefixgate.doctor import breakers as brk
from prefixgate.doctor import distribution as dist_mod
from prefixgate.doctor import predict as pred_mod
from prefixgate.doctor import segments as seg_mod
from prefixgate.doctor.findings import CRITICAL, INFO, SEVERITY_ORDER, WARNING, Finding, Table
from prefixgate.doctor.output import pct, tokens
from prefixgate.store import Store

CRITICAL_SHARE = 0.10  # a breaker costing 10% of its upstream's prompt tokens is critical
CRITICAL_GAIN = 0.10
WORTH_GAIN = 0.02
DEFAULT_BLOCK = 16  # vLLM's default block size, when neither metrics nor records say


def block_size(
    store: Store, b: brk.Breaker, since: float | None, until: float | None, hint: int | None
) -> tuple[int, str]:
    """The block size to replay with, and where it came from."""
    if hint:
        return hint, "vLLM cache_config_info"
    found = dist_mod.infer_block(dist_mod.cached_values(store, b.filters(), since, until))
    if found is not None:
        return found.block, found.source
    return DEFAULT_BLOCK, "assumed (vLLM's default; no cached figures to infer it from)"


def transform(b: brk.Breaker) -> pred_mod.Transform:
    """The fix as the replay applies it: the list sorted, or the segment made stable."""
    if b.cls == "reordered_list" and b.segment == "tools":
        return pred_mod.sorted_tools
    upstream = b.example.upstream if b.example else b.segment
    return pred_mod.neutralised(upstream)


def prediction(
    store: Store, b: brk.Breaker, since: float | None, until: float | None, hint: int | None
) -> tuple[pred_mod.Prediction | None, int, str]:
    filters = [*b.filters(), ("client", b.client)]
    captured = seg_mod.load(store, filters, since, until)
    block, source = block_size(store, b, since, until, hint)
    if not captured:
        return None, block, source
    return pred_mod.predict(captured, block, transform(b)), block, source


def finding(
    store: Store, b: brk.Breaker, since: float | None, until: float | None, hint: int | None
) -> Finding:
    """The finding of one breaker no slice finding names."""
    p, block, source = prediction(store, b, since, until, hint)
    gain = p.predicted_rate - p.measured_rate if p else 0.0
    if b.scope == "sessions":
        # Only each session's first request pays: the traffic as a whole says how much.
        severity = CRITICAL if gain >= CRITICAL_GAIN else WARNING if gain >= WORTH_GAIN else INFO
        of = "of the session openings"
    else:
        severity = CRITICAL if b.share >= CRITICAL_SHARE or gain >= CRITICAL_GAIN else WARNING
        of = f"of {b.client or 'the'} traffic"
    kind = "per_session_prefix" if b.scope == "sessions" else "prefix_broken"
    title = (
        f"{brk.what(b)} {brk.where(b)} changes {brk.how_often(b).split(' (')[0]}: "
        f"{tokens(b.lost_tokens)} prompt tokens recomputed ({pct(b.share)} {of} on "
        f"{b.channel} / {b.upstream_model})"
    )
    f = Finding(kind=kind, severity=severity, title=title)
    f.summary += lines(b)
    f.summary.append(f"block size {block} ({source})")
    pred_mod.summarize(f, p)
    f.fix = brk.advice(b)
    f.evidence.insert(0, table(b))
    f.facts = {
        "breaker": b.as_dict(),
        "tokens_lost": b.lost_tokens,
        "prediction": p.as_dict() if p else None,
        "block_size": block,
        "cause": (b.example.known if b.example else None) or b.cls,
        "channel": b.channel,
        "slice": None,
    }
    return f


def lines(b: brk.Breaker) -> list[str]:
    """What the record says about a breaker, in sentences."""
    ex = b.example
    out = [
        f"on {b.channel} / {b.upstream_model}, from {b.client or 'an unnamed client'}: "
        f"{brk.what(b)} {brk.where(b)} changes {brk.how_often(b)}",
        f"the upstream prompt breaks at {ex.upstream if ex else '?'} ≈{b.at_tokens:,} tokens in "
        f"(mean); {tokens(b.lost_tokens)} prompt tokens sent before came again after it and "
        f"were computed again: {pct(b.share)} of "
        + ("the compared session openings'" if b.scope == "sessions" else f"{b.client or 'its'}")
        + " prompt tokens there"
        + ("" if b.per_day is None else f", ≈{tokens(b.per_day)} a day"),
    ]
    shape = ex.shape if ex else None
    if shape is not None and (shape.old_skeleton or shape.new_skeleton):
        out.append(
            f"change shape (no text kept): {shape.old_skeleton or '∅'} → "
            f"{shape.new_skeleton or '∅'} ({shape.old_chars} → {shape.new_chars} chars) at "
            f"line {shape.line}, paragraph {shape.paragraph} of {b.segment}"
        )
    out += b.corroboration
    others = {c: n for c, n in b.classes.items() if c != b.cls}
    if others:
        out.append("also seen there: " + ", ".join(f"{c} ×{n}" for c, n in sorted(others.items())))
    return out


def table(b: brk.Breaker) -> Table:
    return Table(
        "breaker (from the capture-time comparison of consecutive requests)",
        ["segment", "class", "breaks", "compared", "sessions", "≈at", "lost", "share"],
        [
            [
                b.segment,
                b.cls,
                b.breaks,
                b.compared,
                b.sessions,
                b.at_tokens,
                tokens(b.lost_tokens),
                pct(b.share),
            ]
        ],
    )


def _names(f: Finding) -> set[str]:
    seg = f.facts.get("segments") or {}
    return {x for x in (seg.get("in_segment"), seg.get("first_unstable")) if x}


def fold(findings: list[Finding], breakers: Sequence[brk.Breaker]) -> list[brk.Breaker]:
    """Fold each breaker into the slice finding that names its segment (same channel);
    return the breakers left over."""
    left = []
    for b in breakers:
        upstream = b.example.upstream if b.example else None
        host = next(
            (
                f
                for f in findings
                if f.kind in ("prefix_broken", "per_session_prefix")
                and f.facts.get("channel") == b.channel
                and f.facts.get("slice") is not None
                and (
                    {b.segment, upstream} & _names(f)
                    or (b.segment == "tools" and "tools" in _names(f))
                )
            ),
            None,
        )
        if host is None:
            left.append(b)
            continue
        also = host.facts.setdefault("breakers", [])
        if not also:  # the costliest first (breakers come most tokens lost first)
            phrase = f"{brk.what(b)} {brk.where(b)} changes {brk.how_often(b).split(' (')[0]}"
            if host.facts.get("cause") in (None, seg_mod.UNKNOWN, seg_mod.TIMESTAMP):
                # the slice's own analysis could not tell what varies: the shape can
                host.title = f"{host.title.rsplit(': ', 1)[0]}: {phrase}"
                host.facts["cause"] = (b.example.known if b.example else None) or b.cls
                host.fix = brk.advice(b)
            else:
                host.title += f" — {phrase}"
            host.facts["breaker"] = b.as_dict()
            host.evidence.insert(0, table(b))
        else:
            host.evidence[0].rows += table(b).rows
        host.summary[1 + 3 * len(also) : 1 + 3 * len(also)] = lines(b)
        also.append(b.as_dict())
        if b.share >= CRITICAL_SHARE and SEVERITY_ORDER[host.severity] > SEVERITY_ORDER[CRITICAL]:
            host.severity = CRITICAL
    return left


__all__ = ["block_size", "finding", "fold", "prediction"]
