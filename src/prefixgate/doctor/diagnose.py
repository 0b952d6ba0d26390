"""The diagnosis, start to end — the billing-header incident's investigation by hand, as one pipeline:

1. slices: split the hit rate by every dimension; rank what pulls it down;
2. distribution: for each weak slice, the cached-token distribution and a pinned constant;
3. segments: which prompt segment breaks the prefix, where, what varies, which cause;
4. predict: the fix, replayed through the cache model, with a calibration figure;
5. control: a healthy slice on the same upstream, proof that the upstream works;
6. upstream health (metrics, engine log), cache report off, usage semantics;
7. breakers found per session (absolute.py), with the slices as corroboration;
8. floods of failed requests (failures.py).
9. the miss ledgers: capacity, routing, the host tier's real contents, calibration.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

from prefixgate.doctor import absolute, cache_report, failures, upstream_health, usage_check
from prefixgate.doctor import breakers as brk
from prefixgate.doctor import distribution as dist_mod
from prefixgate.doctor import ledger as ledger_mod
from prefixgate.doctor import predict as pred_mod
from prefixgate.doctor import segments as seg_mod
from prefixgate.doctor import slices as slice_mod
from prefixgate.doctor.findings import (
    CRITICAL,
    INFO,
    SEVERITY_ORDER,
    WARNING,
    Diagnosis,
    Finding,
    Table,
)
from prefixgate.doctor.holder import HolderRecords
from prefixgate.doctor.output import pct, tokens
from prefixgate.doctor.timespec import format_day
from prefixgate.store import Store, open_store

MAX_WEAK = 3
CRITICAL_GAIN = 0.10  # a fix that would gain 10 points is critical
WORTH_REPORTING_GAIN = 0.02

_CAUSE_TITLE = {
    seg_mod.BILLING: "Claude Code's billing header at the start of the prompt",
    seg_mod.HOISTED: "mid-conversation system messages hoisted into the system prompt",
    seg_mod.TIMESTAMP: "a date/time in the system prompt",
    seg_mod.REORDERED: "tools sent in a different order",
    seg_mod.TOOLS_CHANGED: "the tool set changes between turns",
    seg_mod.COMPACTION: "compaction boundaries (history restarts)",
    seg_mod.UNKNOWN: "an unstable prompt segment",
}

MetricsInput = Sequence[str | tuple[str, str]] | None


def diagnose(
    store_dsn: str,
    *,
    since: float | None = None,
    until: float | None = None,
    metrics_urls: Sequence[str] = (),
    engine_log: str | Path | None = None,
    metrics_snapshots: MetricsInput = None,
    min_loss_share: float = brk.MIN_LOSS_SHARE,
    min_loss_per_day: float = brk.MIN_LOSS_PER_DAY,
    channel_metrics: dict[str, str] | None = None,
    probes: dict[str, cache_report.Evidence] | None = None,
    policies: dict[str, str] | None = None,
    key: str | None = None,
) -> Diagnosis:
    """Diagnose the records in ``store_dsn`` received in ``[since, until)``.

    ``metrics_snapshots``: Prometheus texts of the upstream(s), each a string or a
    ``(source, text)`` pair; several of one source are read as first/last (deltas).
    ``metrics_urls`` are fetched once each; ``engine_log`` is a vLLM log file.
    A breaker (a segment that changes within sessions) is reported when it costs at
    least ``min_loss_share`` of its upstream's prompt tokens or ``min_loss_per_day``
    tokens a day. ``channel_metrics`` names the metrics URL of each channel (among
    ``metrics_urls``) and ``probes`` holds active probes' evidence per channel: both tell
    a cache report that is off from one with nothing to report.
    ``policies``: each channel's routing policy (what the routing finding improves on).
    ``key``: only the records of the key of that name are read (a key holder's own view:
    :mod:`.holder`)."""
    with open_store(store_dsn) as opened:
        store = opened if key is None else HolderRecords(opened, key, since or 0.0)
        d = Diagnosis(
            store=_safe_dsn(store_dsn),
            since=since,
            until=until,
            generated_at=time.time(),
            overall={},
            days=[],
            slices=[],
            findings=[],
        )
        urls = list(metrics_urls) + [
            u for u in (channel_metrics or {}).values() if u not in metrics_urls
        ]
        block_hint, counters = _upstream(d, urls, engine_log, metrics_snapshots)
        evidence: dict[str, cache_report.Evidence] = {}
        for ch, url in (channel_metrics or {}).items():
            ev = cache_report.from_metrics(counters[url]) if url in counters else None
            if ev is not None:
                evidence[ch] = ev
        for ch, ev in (probes or {}).items():
            if ch not in evidence and ev.verdict != cache_report.UNKNOWN:
                evidence[ch] = ev
        if store.schema_version() == 0:
            d.overall = slice_mod.Rate().as_dict()
            d.notes.append("the store is empty (no schema): nothing recorded yet")
        else:
            cells = _records(d, store, since, until, block_hint, evidence)
            _breakers(d, store, cells, since, until, block_hint, min_loss_share, min_loss_per_day)
            _ledgers(d, store, since, until, policies)
    if all(f.kind == "calibration" for f in d.findings):
        d.findings.append(
            Finding(
                "no_problem",
                INFO,
                "no slice is significantly below its peers; no upstream problem seen",
            )
        )
    d.findings.sort(
        key=lambda f: (SEVERITY_ORDER.get(f.severity, 9), -f.facts.get("tokens_lost", 0))
    )
    return d


def _safe_dsn(dsn: str) -> str:
    """The store's DSN as a report may print it: no user or password (the last ``@`` of
    the authority ends them, a password may hold ``@``), no query (``?password=``,
    ``sslpassword=`` …) and no ``password=`` of a key-value DSN."""
    if "://" not in dsn:
        return _PASSWORD_KV.sub(r"\1=…", dsn)
    scheme, rest = dsn.split("://", 1)
    rest = rest.split("?", 1)[0]
    if "@" in rest:
        rest = "…@" + rest.rpartition("@")[2]
    return f"{scheme}://{rest}"


_PASSWORD_KV = re.compile(r"(\w*password)\s*=\s*(?:'(?:[^'\\]|\\.)*'|\S+)", re.I)


# -- upstream sources ---------------------------------------------------------------------


def _upstream(
    d: Diagnosis, urls: Sequence[str], log: str | Path | None, snaps: MetricsInput
) -> tuple[int | None, dict[str, upstream_health.Counters]]:
    """Findings from the metrics and the engine log; the block size they say, and each
    source's counters (deltas between its first and last snapshot)."""
    by_source: dict[str, list[upstream_health.Counters]] = {}
    for item in snaps or ():
        source, text = item if isinstance(item, tuple) else ("metrics", item)
        by_source.setdefault(source, []).append(upstream_health.parse_metrics(text))
    for url in urls:
        try:
            text = upstream_health.fetch_metrics(url)
        except Exception as exc:  # noqa: BLE001 - a dead endpoint is a note, not a crash
            d.notes.append(f"could not read metrics from {url}: {type(exc).__name__}")
            continue
        by_source.setdefault(url, []).append(upstream_health.parse_metrics(text))
    block = None
    summed: dict[str, upstream_health.Counters] = {}
    for source, counters in by_source.items():
        f = upstream_health.metrics_finding(source, counters)
        if f:
            d.findings.append(f)
        block = block or next((c.block_size for c in counters if c.block_size), None)
        summed[source] = (
            upstream_health.delta(counters[0], counters[-1]) if len(counters) > 1 else counters[0]
        )
    if log is not None:
        path = Path(log)
        try:
            with path.open(encoding="utf-8", errors="replace") as fh:
                stats = upstream_health.parse_log(fh)
        except OSError as exc:
            d.notes.append(f"could not read engine log {path}: {exc.strerror}")
        else:
            f = upstream_health.log_finding(path.name, stats)
            if f:
                d.findings.append(f)
            elif stats.rate_lines == 0:
                d.notes.append(f"engine log {path.name}: no prefix-cache rate lines found")
    return block, summed


# -- records ------------------------------------------------------------------------------


def _records(
    d: Diagnosis,
    store: Store,
    since: float | None,
    until: float | None,
    block_hint: int | None,
    evidence: dict[str, cache_report.Evidence],
) -> list[slice_mod.Cell]:
    cells = slice_mod.load_cells(store, since, until)
    overall = slice_mod.total(cells)
    d.overall = overall.as_dict()
    d.days = [{"day": format_day(day), **r.as_dict()} for day, r in slice_mod.by_day(cells).items()]
    silent = {
        ch: (n, evidence.get(ch) or cache_report.from_records(store, ch, since, until))
        for ch, n in slice_mod.silent_channels(cells).items()
    }
    d.findings += cache_report.finding(silent)
    # Absent because nothing hit: counted as 0 cached, judged with the rest.
    unmeasured = {ch for ch, (_, ev) in silent.items() if ev.verdict != cache_report.NOTHING_HIT}
    judged = [c for c in cells if c.channel not in unmeasured]
    ranked = slice_mod.rank(judged)
    d.slices = [s.as_dict() for s in ranked[:30]]
    weak = slice_mod.weak(ranked, judged)[:MAX_WEAK]
    for s in weak:
        d.findings.append(
            _slice_finding(store, s, ranked, judged, since, until, block_hint, weak=True)
        )
    # Slices that are not (yet) weak can still carry a diagnosable break: one per entry —
    # unless the capture compared the requests: the breakers find those, per session.
    covered = list(weak)
    compared = any(c.compared is not None for c in cells)
    for e in [] if compared else slice_mod.group(judged, ["endpoint"]):
        s = next((x for x in ranked if x.same(e)), e)
        if s.rate.requests < slice_mod.MIN_REQUESTS or any(
            _overlaps(s, w, judged) for w in covered
        ):
            continue
        covered = [*covered, s]
        f = _slice_finding(store, s, ranked, judged, since, until, block_hint, weak=False)
        if f is not None:
            d.findings.append(f)
    u = usage_check.check(store, since, until)
    if u:
        d.findings.append(u)
    for flood in failures.floods(failures.load(store, since, until, cells)):
        d.findings.append(failures.finding(store, flood, since, until))
    return cells


def _breakers(
    d: Diagnosis,
    store: Store,
    cells: list[slice_mod.Cell],
    since,
    until,
    hint: int | None,
    share: float,
    per_day: float,
) -> None:
    """Absolute detection (doctor/absolute.py): each material breaker folded into the
    slice finding that names it, or a finding of its own."""
    found = brk.load(store, since, until, cells)
    d.breakers = [b.as_dict() for b in found[:30]]
    left = absolute.fold(d.findings, brk.material(found, min_share=share, min_per_day=per_day))
    for b in left:
        d.findings.append(absolute.finding(store, b, since, until, hint))


def _ledgers(
    d: Diagnosis, store: Store, since: float | None, until: float | None, policies
) -> None:
    found, host_seen = ledger_mod.findings(store, since, until, policies)
    if host_seen:  # the engines' events showed the host tier: no guessing from counters
        guessed = [f for f in d.findings if f.kind == "l2_write_only"]
        d.findings = [f for f in d.findings if f not in guessed]
        if guessed:
            d.notes.append("host tier judged from the engines' KV events, not from counters")
    d.findings.extend(found)


def _overlaps(a: slice_mod.Slice, b: slice_mod.Slice, cells: list[slice_mod.Cell]) -> bool:
    shared = sum(c.prompt_tokens for c in cells if a.matches(c) and b.matches(c))
    return shared >= slice_mod.SAME_SET * min(a.rate.prompt_tokens, b.rate.prompt_tokens)


def _scope_filters(s: slice_mod.Slice) -> list[tuple[str, str | None]]:
    if s.dimension in slice_mod.GLOBAL:
        return s.filters()
    return [("channel", s.channel), ("upstream_model", s.upstream_model)]


def _block(
    store: Store, s: slice_mod.Slice, since, until, hint: int | None
) -> dist_mod.BlockSize | None:
    if hint:
        return dist_mod.BlockSize(hint, hint, 0, True, source="vLLM cache_config_info")
    return dist_mod.infer_block(dist_mod.cached_values(store, _scope_filters(s), since, until))


def _slice_finding(
    store: Store,
    s: slice_mod.Slice,
    ranked: list[slice_mod.Slice],
    cells: list[slice_mod.Cell],
    since: float | None,
    until: float | None,
    block_hint: int | None,
    *,
    weak: bool,
) -> Finding | None:
    block = _block(store, s, since, until, block_hint)
    groups = dist_mod.load(store, s.filters(), since, until)
    dist = dist_mod.analyse(groups, block.block if block else None)
    captured = seg_mod.load(store, s.filters(), since, until)
    seg = seg_mod.analyse(captured, store.get_texts) if captured else None
    prediction = None
    if seg is not None and seg.cause and block:
        fix = pred_mod.transform_for(seg)
        if fix is not None:
            prediction = pred_mod.predict(captured, block.block, fix)
    gain = prediction.predicted_rate - prediction.measured_rate if prediction else None
    if not weak:
        # Only worth a finding when a diagnosable break costs something.
        if seg is None or not seg.cause or seg.cause == seg_mod.COMPACTION:
            return None
        if gain is None or gain < WORTH_REPORTING_GAIN:
            return None
    severity = WARNING
    if (gain is not None and gain >= CRITICAL_GAIN) or (
        s.gap >= 0.2 and s.tokens_lost >= 0.05 * sum(c.prompt_tokens for c in cells)
    ):
        severity = CRITICAL
    if seg is not None and seg.scope == "cross-session" and (gain or 0) < CRITICAL_GAIN:
        severity = WARNING if (gain or 0) >= WORTH_REPORTING_GAIN else INFO
    cause = seg.cause if seg else None
    kind = (
        "per_session_prefix"
        if seg is not None and seg.scope == "cross-session"
        else "prefix_broken"
    )
    what = _CAUSE_TITLE.get(cause or "", "cause not identified (no segment captures)")
    if seg is not None and seg.scope == "cross-session":
        what = f"{what}, different in every session"
    title = f"{s.label} on {s.scope} hits {pct(s.rate.hit_rate)}"
    if s.peer_rate is not None:
        title += f" vs {pct(s.peer_rate.hit_rate)} for {s.peer}"
    title += f": {what}"
    f = Finding(kind=kind, severity=severity, title=title)
    f.facts = {
        "slice": s.as_dict(),
        "tokens_lost": s.tokens_lost,
        "block_size": block.block if block else None,
        "block_size_confident": block.confident if block else None,
        "distribution": dist.as_dict(),
        "segments": _seg_dict(seg),
        "prediction": prediction.as_dict() if prediction else None,
        "cause": cause,
        "channel": s.channel,
    }
    _summary_slice(f, s)
    _summary_distribution(f, dist, block)
    _summary_segments(f, seg, dist)
    if cause:
        f.fix = pred_mod.fix_advice(cause, s.channel, seg.volatility if seg else None)
    pred_mod.summarize(f, prediction)
    _summary_control(f, store, s, since, until, block)
    return f


def _seg_dict(seg: seg_mod.SegmentReport | None) -> dict | None:
    if seg is None:
        return None
    from dataclasses import asdict

    out = asdict(seg)
    out["stability"] = [{**asdict(x), "volatility": x.volatility} for x in seg.stability]
    return out


def _summary_slice(f: Finding, s: slice_mod.Slice) -> None:
    same = [a for a in s.aliases if not a.startswith("within ")]
    within = [a.removeprefix("within ") for a in s.aliases if a.startswith("within ")]
    also = f" (the same requests as {', '.join(same)})" if same else ""
    if within:
        also += f" (and what pulls down {', '.join(within)})"
    line = (
        f"slice {s.label}{also} on {s.scope}: {s.rate.requests:,} requests, prompt "
        f"{tokens(s.rate.prompt_tokens)}, cached {tokens(s.rate.cached_tokens)}, hit rate {pct(s.rate.hit_rate)}"
    )
    if s.peer_rate is not None:
        line += (
            f"; best comparable slice {s.peer} {pct(s.peer_rate.hit_rate)}; "
            f"{tokens(s.tokens_lost)} prompt tokens lost"
        )
    f.summary.append(line)


def _summary_distribution(
    f: Finding, dist: dist_mod.Distribution, block: dist_mod.BlockSize | None
) -> None:
    rows = [
        [b.label, b.requests, tokens(b.prompt_mean), tokens(b.cached_mean)] for b in dist.buckets
    ]
    f.evidence.append(
        Table(
            "cached_tokens distribution", ["cached", "requests", "avg prompt", "avg cached"], rows
        )
    )
    if dist.modes:
        f.evidence.append(
            Table(
                "most frequent exact cached values",
                ["cached", "requests", "share", "prompt range"],
                [
                    [
                        m["cached"],
                        m["requests"],
                        pct(m["share"], 1),
                        f"{tokens(m['prompt_min'])}–{tokens(m['prompt_max'])}",
                    ]
                    for m in dist.modes
                ],
            )
        )
    p = dist.pinned
    if p is None:
        return
    bs = ""
    if block:
        bs = (
            f" (block size {block.block}, from {block.source}"
            + (f", {block.distinct_values} distinct values" if block.distinct_values else "")
            + ("" if block.confident else "; few values, may be a multiple")
            + ")"
        )
    verdict = "explains the rate" if p.explains else "does not explain the rate alone"
    f.summary.append(
        f"cached_tokens pinned at {p.expression}{bs} in {p.requests:,} of {dist.requests:,} requests "
        f"({pct(p.share, 1)}) while their prompts range {tokens(p.prompt_min)}–{tokens(p.prompt_max)} "
        f"(CV {p.prompt_cv:.2f}): {p.value} / mean prompt {tokens(p.slice_prompt_mean)} = {pct(p.naive_ratio, 1)}, "
        f"× {pct(p.share, 1)} pinned = {pct(p.explained_rate)} of the measured {pct(p.measured_rate)} → {verdict}"
    )


def _summary_segments(
    f: Finding, seg: seg_mod.SegmentReport | None, dist: dist_mod.Distribution
) -> None:
    if seg is None:
        f.summary.append(
            "no segment captures for this slice: enable store.capture_segments to locate the break"
        )
        return
    if not seg.first_unstable:
        f.summary.append(
            f"segments: {seg.pairs} consecutive same-session pairs, {seg.breaks} breaks; no unstable "
            "segment before the history (sessions extend themselves)"
        )
        return
    where = (
        "between consecutive requests of a session"
        if seg.scope == "session"
        else "between sessions"
    )
    line = (
        f"first unstable segment in upstream order: {seg.first_unstable} ({seg.first_unstable_kind}) at "
        f"≈{seg.offset_tokens:,} tokens (estimated, scaled to the recorded prompts), changing {where} "
        f"({seg.breaks if seg.scope == 'session' else sum(seg.causes.values())} breaks)"
    )
    const = dist.pinned.value if dist.pinned else None
    if const:
        block = dist.pinned.block if dist.pinned else None
        ok = seg_mod.matches_constant(seg.offset_tokens, const, block)
        line += f"; {'matches' if ok else 'does not match'} the pinned constant {const}"
        f.facts["offset_matches_constant"] = ok
    f.summary.append(line)
    if seg.in_segment:
        vol = seg.volatility or "?"
        target = seg.stability[0] if seg.stability else None
        if target and vol == seg_mod.PER_REQUEST and target.distinct_across_sessions > 1:
            vol += f" (and different across sessions: {target.distinct_across_sessions}/{target.sessions})"
        f.summary.append(
            f"as received: {seg.in_segment} — {vol} volatility; cause: {seg.cause} ({seg.cause_detail})"
        )
    else:
        f.summary.append(f"cause: {seg.cause} ({seg.cause_detail})")
    if seg.diffs:
        f.summary.append("what varies: " + " | ".join(seg.diffs))
    elif not seg.texts_captured:
        f.summary.append(
            "texts not captured (`capture_text: true` on the channel or key shows what varies)"
        )
    if seg.stability:
        f.evidence.append(
            Table(
                "segment stability",
                [
                    "segment",
                    "side",
                    "≈tokens",
                    "changed within sessions",
                    "distinct across sessions",
                    "volatility",
                ],
                [
                    [
                        x.segment,
                        "received" if x.side == "in" else "upstream",
                        x.tokens,
                        f"{x.changed_in_session}/{x.pairs}",
                        f"{x.distinct_across_sessions}/{x.sessions}",
                        x.volatility,
                    ]
                    for x in seg.stability
                ],
            )
        )


def _summary_control(
    f: Finding,
    store: Store,
    s: slice_mod.Slice,
    since,
    until,
    block: dist_mod.BlockSize | None,
) -> None:
    if s.peer is None or s.peer_rate is None:
        return
    groups = dist_mod.load(store, s.peer_filters(), since, until)
    pd = dist_mod.analyse(groups, block.block if block else None)
    top = pd.buckets[-1] if pd.buckets else None
    follow = ""
    if top is not None and top.prompt_mean:
        follow = (
            f"; in its top bucket ({top.label}) avg cached {tokens(top.cached_mean)} vs avg prompt "
            f"{tokens(top.prompt_mean)}"
        )
    pinned = f"; pinned at {pd.pinned.value}" if pd.pinned else "; no pinned value"
    f.summary.append(
        f"control: {s.peer} on the same upstream ({s.scope}) hits {pct(s.peer_rate.hit_rate)} over "
        f"{s.peer_rate.requests:,} requests{follow}{pinned} — the upstream's cache itself works"
    )
    f.facts["control"] = {"slice": s.peer, **s.peer_rate.as_dict(), "distribution": pd.as_dict()}
    f.evidence.insert(
        0,
        Table(
            "slice vs control",
            ["slice", "requests", "prompt", "cached", "hit rate"],
            [
                [
                    s.label,
                    s.rate.requests,
                    tokens(s.rate.prompt_tokens),
                    tokens(s.rate.cached_tokens),
                    pct(s.rate.hit_rate),
                ],
                [
                    f"{s.peer} (control)",
                    s.peer_rate.requests,
                    tokens(s.peer_rate.prompt_tokens),
                    tokens(s.peer_rate.cached_tokens),
                    pct(s.peer_rate.hit_rate),
                ],
            ],
        ),
    )


def exit_code(d: Diagnosis) -> int:
    """2 when a critical finding exists (for cron), else 0."""
    return 2 if d.critical else 0


__all__ = ["diagnose", "exit_code"]
