"""The diagnosis as text a person reads top-down (findings first, by severity, evidence
under each as small tables) and as JSON."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from typing import Any

from prefixgate.doctor.findings import SEVERITY_ORDER, Diagnosis, Finding, Table
from prefixgate.doctor.timespec import format_time

WIDTH = 100


def tokens(n: float | None) -> str:
    """48110000 → ``48.11M``, 106667 → ``106.7k``, 99032000000 → ``99.03B``."""
    if n is None:
        return "-"
    n = float(n)
    if abs(n) >= 1e9:
        return f"{n / 1e9:.2f}B"
    if abs(n) >= 1e6:
        return f"{n / 1e6:.2f}M"
    if abs(n) >= 1e4:
        return f"{n / 1e3:.1f}k"
    return f"{n:,.0f}"


def pct(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x * 100:.{digits}f}%"


def table(t: Table, indent: str = "   ") -> str:
    cells = [[str(c) for c in t.columns]] + [
        ["-" if v is None else str(v) for v in r] for r in t.rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(t.columns))]

    def line(row: Sequence[str]) -> str:
        return (
            indent + "| " + " | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) + " |"
        )

    out = [
        indent + t.title,
        line(cells[0]),
        indent + "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def _wrap(text: str, indent: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def finding_text(i: int, f: Finding) -> str:
    parts = [f"{i}. [{f.severity.upper()}] {f.title}"]
    parts += [_wrap(s, "   ") for s in f.summary]
    if f.fix:
        parts.append("   Fix:")
        parts += [_wrap(f"- {x}", "     ") for x in f.fix]
    for t in f.evidence:
        parts.append("")
        parts.append(table(t))
    return "\n".join(parts)


def render_text(d: Diagnosis) -> str:
    o = d.overall
    head = [
        f"prefixgate doctor — {d.store}",
        f"window: {format_time(d.since)} → {format_time(d.until)}",
        f"overall: {o['requests']:,} requests, prompt {tokens(o['prompt_tokens'])}, "
        f"cached {tokens(o['cached_tokens'])}, hit rate {pct(o['hit_rate'])}",
        "",
        "Findings (most severe first)",
    ]
    findings = sorted(d.findings, key=lambda f: SEVERITY_ORDER.get(f.severity, 9))
    head += [f"  {i}. [{f.severity.upper()}] {f.title}" for i, f in enumerate(findings, 1)]
    body = [finding_text(i, f) for i, f in enumerate(findings, 1)]
    tail = []
    if d.slices:
        rows = [
            [
                s["slice"],
                s["scope"],
                s["requests"],
                tokens(s["prompt_tokens"]),
                pct(s["hit_rate"]),
                s["peer"],
                pct(s["peer_hit_rate"]),
                tokens(s["tokens_lost"]),
            ]
            for s in d.slices[:15]
        ]
        tail.append(
            table(
                Table(
                    "Slices ranked by prompt tokens lost vs their best peer",
                    [
                        "slice",
                        "upstream",
                        "requests",
                        "prompt",
                        "hit rate",
                        "best peer",
                        "peer rate",
                        "lost",
                    ],
                    rows,
                ),
                indent="",
            )
        )
    if d.days:
        rows = [
            [
                x["day"],
                x["requests"],
                tokens(x["prompt_tokens"]),
                tokens(x["cached_tokens"]),
                pct(x["hit_rate"]),
            ]
            for x in d.days
        ]
        tail.append(
            table(
                Table("Per day (UTC)", ["day", "requests", "prompt", "cached", "hit rate"], rows),
                indent="",
            )
        )
    notes = [f"note: {n}" for n in d.notes]
    sections = ["\n".join(head), *body, *tail, *(["\n".join(notes)] if notes else [])]
    return ("\n\n" + "─" * 80 + "\n").join(sections[:1] + ["\n\n".join(sections[1:])]) + "\n"


def to_json(d: Diagnosis, **kwargs: Any) -> str:
    return json.dumps(d.to_dict(), ensure_ascii=False, **kwargs)
