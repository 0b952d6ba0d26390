"""Errors are findings: floods of failed requests, each kind with its cause and fix.

A hit rate is computed over the requests that were served; when half of a client's
requests fail, the cache is not the problem, and "no upstream problem seen" would be a
lie. Failed records keep their status, error type and a short reason
(:mod:`prefixgate.record.reason`): they are grouped inside the database per upstream,
client and reason, and each kind that floods becomes a finding —

- **context overflow**: the client sends prompts longer than the upstream's window
  (``max_model_len``); the client's idea of the window is larger than the server's. The
  prompts the client sent (the largest it got served, and the estimated size of the refused
  ones) are set beside the window the upstream reports, with the fix on both sides;
- **unknown model**: the client asks for a model no channel (or upstream) serves;
- **upstream unreachable**: connections refused, timed out, or answered with 5xx;
- **rate limited**: the gateway's per-key limits or the upstream's own 429s.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from prefixgate.doctor import query
from prefixgate.doctor.findings import CRITICAL, WARNING, Finding, Table
from prefixgate.doctor.output import pct, tokens
from prefixgate.doctor.slices import Cell
from prefixgate.record.segments import prefix_tokens
from prefixgate.store import Store, lists

MIN_FAILED = 5  # a flood: at least this many failures of one kind ...
MIN_SHARE = 0.02  # ... and this share of the client's requests
CRITICAL_SHARE = 0.20  # a fifth of a client's requests failing is critical
SAMPLE = 200  # refused requests whose prompt sizes are estimated

OVERFLOW = "context_overflow"
UNKNOWN_MODEL = "unknown_model"
UNREACHABLE = "upstream_unreachable"
RATE_LIMITED = "rate_limited"
OTHER = "errors"

_TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")
_CONTEXT = re.compile(r"maximum context length|context length|max_model_len", re.I)
_NO_MODEL = re.compile(r"not served here|no such model|does not exist|model .* not found", re.I)
_UNREACHABLE = re.compile(
    r"cannot reach upstream|connect timed out|did not answer within|connection failed"
    r"|upstream unavailable|upstream error \(5\d\d\)|sent nothing for",
    re.I,
)


def kind_of(status: int, error_type: str | None, message: str | None) -> str:
    """The kind of a failure, from what its record says."""
    msg = message or ""
    if status == 429 or error_type == "rate_limit_error":
        return RATE_LIMITED
    if _TOO_LONG.search(msg) or (status in (400, 413) and _CONTEXT.search(msg)):
        return OVERFLOW
    if status == 404 and _NO_MODEL.search(msg):
        return UNKNOWN_MODEL
    if status in (502, 503, 504, 529) or _UNREACHABLE.search(msg):
        return UNREACHABLE
    return OTHER


@dataclass
class Flood:
    kind: str
    channel: str | None
    upstream_model: str | None
    client: str | None
    failed: int = 0
    requests: int = 0  # all of the client's requests on this upstream
    served_max: int = 0  # the largest prompt it was served
    reasons: dict[str, int] = field(default_factory=dict)
    models: dict[str | None, int] = field(default_factory=dict)

    @property
    def share(self) -> float:
        return self.failed / self.requests if self.requests else 0.0

    def top_reasons(self, n: int = 3) -> list[tuple[str, int]]:
        return sorted(self.reasons.items(), key=lambda x: -x[1])[:n]


def load(
    store: Store, since: float | None, until: float | None, cells: Iterable[Cell]
) -> list[Flood]:
    """Failures grouped by kind, upstream and client, with every client's request count
    (the served ones from the slices' ``cells``, no scan of their own)."""
    where, params = query.window(since, until)
    totals: dict[tuple, int] = defaultdict(int)
    served: dict[tuple, int] = defaultdict(int)
    for c in cells:
        totals[(c.channel, c.upstream_model, c.client)] += c.requests
        served[(c.channel, c.client)] = max(served[(c.channel, c.client)], c.max_prompt)
    floods: dict[tuple, Flood] = {}
    rows = query.run(
        store,
        "SELECT channel, upstream_model, client, requested_model, status, error_type,"
        " error_message, COUNT(*) FROM requests"
        f" WHERE (status < 200 OR status >= 300) AND status <> 499{where}"
        " GROUP BY channel, upstream_model, client, requested_model, status, error_type,"
        " error_message",
        params,
    )
    for ch, model, client, _, _, _, _, n in rows:
        totals[(ch, model, client)] += int(n)
    for ch, model, client, requested, status, etype, message, n in rows:
        kind = kind_of(int(status or 0), etype, message)
        # A request refused before a channel was chosen counts against its client alone.
        f = floods.setdefault(
            (kind, ch, model, client),
            Flood(
                kind,
                ch,
                model,
                client,
                requests=totals.get((ch, model, client), 0),
                served_max=served.get((ch, client), 0),
            ),
        )
        n = int(n)
        f.failed += n
        reason = message or etype or f"status {status}"
        f.reasons[reason] = f.reasons.get(reason, 0) + n
        f.models[requested] = f.models.get(requested, 0) + n
    return sorted(floods.values(), key=lambda f: -f.failed)


def floods(found: list[Flood]) -> list[Flood]:
    return [f for f in found if f.failed >= MIN_FAILED and f.share >= MIN_SHARE]


def _scope(f: Flood, since, until) -> tuple[str, list]:
    """The flood's client on its channel, in the window: an ``AND``-able clause."""
    where, params = query.window(since, until)
    for column, value in (("channel", f.channel), ("client", f.client)):
        s, p = query.equals(column, value)
        where += s
        params += p
    return where, params


def _refused_sizes(store: Store, f: Flood, since, until) -> list[int]:
    """Estimated prompt tokens of recent refused requests (their captured segments)."""
    where, params = _scope(f, since, until)
    rows = query.run(
        store,
        f"SELECT {lists.SELECT} FROM requests"
        f" WHERE status >= 400 AND status < 500 AND segments_in IS NOT NULL{where}"
        f" ORDER BY received_at DESC LIMIT {SAMPLE}",
        params,
    )
    out = []
    for s_in, s_out in lists.whole(store, rows):
        segs = s_out if s_out is not None else s_in
        if segs is not None:
            out.append(prefix_tokens(segs))
    return out


def finding(store: Store, f: Flood, since, until) -> Finding:
    who = f.client or "an unnamed client"
    where = f"{f.channel} / {f.upstream_model}" if f.channel else "the gateway (no channel chosen)"
    severity = CRITICAL if f.share >= CRITICAL_SHARE else WARNING
    head = f"{f.failed:,} of {who}'s {f.requests:,} requests on {where} failed ({pct(f.share)})"
    out = Finding(kind=f.kind, severity=severity, title="")
    out.summary.append(head)
    out.evidence.append(
        Table("most frequent reasons", ["reason", "requests"], [list(r) for r in f.top_reasons()])
    )
    out.facts = {
        "channel": f.channel,
        "upstream_model": f.upstream_model,
        "client": f.client,
        "failed": f.failed,
        "requests": f.requests,
        "share": round(f.share, 6),
        "reasons": dict(f.top_reasons(10)),
        "tokens_lost": 0,
    }
    if f.kind == OVERFLOW:
        _overflow(out, store, f, since, until)
    elif f.kind == UNKNOWN_MODEL:
        names = ", ".join(f"{m!r}" for m in f.models if m) or "(none)"
        out.title = (
            f"{who} asks for model(s) nobody serves: {names} ({pct(f.share)} of its requests)"
        )
        out.fix = [
            "serve the name: add it to a channel's `models`, or map it to a served model with "
            "`model_map` (e.g. Claude Code's background model, set by ANTHROPIC_SMALL_FAST_MODEL)",
            f"or have {who} ask for a model the gateway serves (`GET /v1/models` lists them)",
        ]
        out.facts["models"] = {str(k): v for k, v in f.models.items()}
    elif f.kind == UNREACHABLE:
        out.title = (
            f"the upstream {where} is unreachable or failing: {pct(f.share)} of {who}'s requests"
        )
        out.fix = [
            "check that the server behind the channel's `base_url` is up and reachable from the "
            "gateway (`prefixgate doctor --metrics-url`, the dashboard's upstream page), and "
            "its logs for crashes or out-of-memory restarts",
            "add a second replica or a failover channel so one server's outage is not the client's",
        ]
    elif f.kind == RATE_LIMITED:
        upstream = sum(n for r, n in f.reasons.items() if r.startswith("upstream rate limit"))
        side = "the upstream" if upstream >= f.failed / 2 else "the gateway's per-key limits"
        out.title = f"{who} is rate limited by {side}: {pct(f.share)} of its requests"
        out.fix = (
            ["the upstream answers 429: add capacity or replicas, or spread the load"]
            if side == "the upstream"
            else [
                "raise the key's `rate_limits` (requests/tokens per minute, concurrency), or "
                "give the client its own key"
            ]
        )
    else:
        out.title = f"{who}'s requests fail on {where}: {pct(f.share)}"
        out.fix = ["see the reasons below and the failed requests on the dashboard's request log"]
    return out


def _overflow(out: Finding, store: Store, f: Flood, since, until) -> None:
    maxima = [int(m.group(2)) for r in f.reasons if (m := _TOO_LONG.search(r))]
    claimed = [int(m.group(1)) for r in f.reasons if (m := _TOO_LONG.search(r))]
    window = max(set(maxima), key=maxima.count) if maxima else None
    refused = _refused_sizes(store, f, since, until)
    served = f.served_max
    biggest = max([*refused, *claimed, served], default=0)
    who = f.client or "the client"
    size = f"≈{tokens(biggest)} tokens" if biggest else "prompts"
    out.title = (
        f"context overflow: {who} sends {size} to {f.channel} / {f.upstream_model}, whose "
        f"window (max_model_len) is {tokens(window) if window else 'smaller'}: "
        f"{pct(f.share)} of its requests refused"
    )
    line = (
        f"the upstream's window: {window:,} tokens"
        if window
        else "the upstream's window: not stated"
    )
    line += f"; the largest prompt it served for {who}: {served:,} tokens" if served else ""
    if refused:
        line += (
            f"; the refused prompts, estimated from their segments (chars / 4): "
            f"{tokens(min(refused))}–{tokens(max(refused))}"
        )
    if claimed and window and max(claimed) <= window + 1:
        line += (
            f" (the upstream's own count, {max(claimed):,}, is a lower bound: it stopped "
            "counting at the window)"
        )
    out.summary.append(line)
    out.summary.append(
        f"{who} believes the window is larger than the server's: it lets the conversation "
        "grow past it instead of compacting in time"
    )
    target = str(window) if window else "<the server's max_model_len>"
    out.fix = [
        f"upstream: start the server with a larger window if the model and KV memory allow "
        f"(vLLM `--max-model-len {max(biggest, window or 0)}` or more; SGLang "
        "`--context-length`)",
        f"client: tell it the real window — Claude Code: `CLAUDE_CODE_MAX_CONTEXT_TOKENS={target}`; "
        f"opencode: the model's `limit.context` in opencode.json set to {target}",
    ]
    out.facts.update(
        {
            "max_model_len": window,
            "largest_served": served,
            "refused_estimated": {"min": min(refused), "max": max(refused)} if refused else None,
            "upstream_counts": sorted(set(claimed))[:10],
        }
    )


__all__ = ["Flood", "finding", "floods", "kind_of", "load"]
