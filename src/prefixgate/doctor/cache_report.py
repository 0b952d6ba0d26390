"""Absent is not off: when no response of a channel carried a cached-token figure, was the
upstream's cache report off, or did nothing hit?

vLLM before 0.32 leaves ``prompt_tokens_details`` out of a response whose prompt hit
nothing, exactly as a server without ``--enable-prompt-tokens-details`` leaves it out of
every response. The records alone cannot tell the two apart by the figure; the evidence
comes from elsewhere, strongest first:

1. **metrics** — the engine's own counters (``vllm:prefix_cache_queries`` / ``_hits``):
   hits while no response reported any means the report is off; queries without a hit
   means nothing hit;
2. **probe** (``prefixgate doctor --probe``) — two identical requests of a few thousand
   tokens straight to the upstream: the second must hit; a figure in its answer means the
   report is on (so the missing figures meant nothing hit), none means it is off;
3. **records** — the capture-time comparison of consecutive requests: requests that
   re-sent their predecessor's whole prompt and still reported nothing say "off"; a
   prefix that breaks within the first block on every request says nothing could hit.

Each verdict says which evidence it rests on.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import msgspec

from prefixgate.doctor import query
from prefixgate.doctor.findings import INFO, WARNING, Finding, Table
from prefixgate.doctor.upstream_health import Counters
from prefixgate.store import Store

OFF = "off"
NOTHING_HIT = "nothing_hit"
UNKNOWN = "unknown"
MIN_EXTENDED = 3  # requests that re-sent their whole predecessor and reported nothing
EARLY_BLOCK = 64  # a break within this many tokens leaves nothing to hit (vLLM's blocks)
PROBE_CHARS = 12_000  # ≈ 3,000 tokens: whole blocks of any size a server uses


@dataclass
class Evidence:
    verdict: str  # OFF | NOTHING_HIT | UNKNOWN
    source: str  # "metrics" | "probe" | "records" | "none"
    detail: str


def from_metrics(c: Counters) -> Evidence | None:
    queries, hits = c.get("prefix_cache_queries"), c.get("prefix_cache_hits")
    if hits > 0:
        return Evidence(
            OFF,
            "metrics",
            f"the engine counts {hits:,.0f} prefix-cache hit tokens of {queries:,.0f} queried, "
            "yet no response reported a cached-token figure",
        )
    if queries > 0:
        return Evidence(
            NOTHING_HIT,
            "metrics",
            f"the engine counts 0 prefix-cache hit tokens of {queries:,.0f} queried",
        )
    return None


def from_records(store: Store, channel: str | None, since, until) -> Evidence:
    where, params = query.window(since, until)
    s, p = query.equals("channel", channel)
    rows = query.run(
        store,
        "SELECT"
        " SUM(CASE WHEN compared = 'session' AND change_class IS NULL THEN 1 ELSE 0 END),"
        f" SUM(CASE WHEN change_class IS NOT NULL AND prompt_tokens * change_at < {EARLY_BLOCK}"
        " THEN 1 ELSE 0 END),"
        " SUM(CASE WHEN compared IS NOT NULL THEN 1 ELSE 0 END)"
        f" FROM requests WHERE {query.OK} AND cached_tokens IS NULL{where}{s}",
        params + p,
    )
    extended, early, compared = (int(v or 0) for v in rows[0]) if rows else (0, 0, 0)
    if extended >= MIN_EXTENDED:
        return Evidence(
            OFF,
            "records",
            f"{extended} requests re-sent their predecessor's whole prompt (nothing changed "
            "before the new part) and still reported no cached tokens",
        )
    if compared and early >= 0.9 * compared:
        return Evidence(
            NOTHING_HIT,
            "records",
            f"the prompt changes within its first {EARLY_BLOCK} tokens on {early} of {compared} "
            "compared requests: there was nothing to hit",
        )
    return Evidence(UNKNOWN, "none", "no evidence either way")


def _probe_body(model: str) -> bytes:
    nonce = os.urandom(8).hex()  # not a prompt any earlier probe left in the cache
    words = " ".join(f"w{i % 97}" for i in range(PROBE_CHARS // 4))
    return msgspec.json.encode(
        {
            "model": model,
            "messages": [
                {"role": "system", "content": f"probe {nonce}. {words}"},
                {"role": "user", "content": "Reply with one word."},
            ],
            "max_tokens": 1,
            "stream": False,
        }
    )


async def probe(channel, transport) -> Evidence:
    """Two identical requests to the channel's upstream (``openai`` channels): does the
    second one's answer carry a cached-token figure?"""
    from prefixgate.engine.channel import bearer, post_for_json

    model = channel.upstream_model(channel.models[0]) if channel.models else None
    url = channel.base_url + "/chat/completions"
    try:
        if model is None:
            listed = await transport.get_json(
                channel.base_url + "/models",
                timeouts=channel.timeouts,
                tls=channel.tls,
                extra_headers=bearer(channel),
            )
            model = listed["data"][0]["id"]
        body = _probe_body(model)
        usage = None
        for _ in range(2):
            usage = (await post_for_json(transport, channel, url, body)).get("usage") or {}
    except Exception as exc:  # noqa: BLE001 - a failed probe is evidence of nothing
        return Evidence(UNKNOWN, "probe", f"the probe failed: {type(exc).__name__}: {exc}")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        n = details["cached_tokens"]
        return Evidence(
            NOTHING_HIT,
            "probe",
            f"a repeated probe request reports cached_tokens {n:,} (of "
            f"{usage.get('prompt_tokens', 0):,}): the report is on, so the missing figures "
            "mean nothing hit",
        )
    return Evidence(OFF, "probe", "a repeated probe request reports no cached-token figure at all")


def probe_all(channels, transport=None) -> dict[str, Evidence]:
    """:func:`probe` for every ``openai`` channel, one after the other."""
    from prefixgate.engine.client import EngineClient
    from prefixgate.upstream import Upstream

    async def run() -> dict[str, Evidence]:
        t = transport or EngineClient(Upstream())
        try:
            return {ch.name: await probe(ch, t) for ch in channels if ch.kind == "openai"}
        finally:
            if transport is None:
                await t.aclose()

    return asyncio.run(run())


def finding(channels: dict[str | None, tuple[int, Evidence]]) -> list[Finding]:
    """The findings for channels whose responses never carried a cached-token figure:
    ``channels`` maps each to (its requests, the evidence)."""
    out = []
    off = {ch: v for ch, v in channels.items() if v[1].verdict != NOTHING_HIT}
    hit = {ch: v for ch, v in channels.items() if v[1].verdict == NOTHING_HIT}
    if off:
        names = ", ".join(ch or "(none)" for ch in off)
        sure = all(ev.verdict == OFF for _, ev in off.values())
        title = (
            f"the upstream's cache report is off on channel(s) {names}"
            if sure
            else f"no cached-token figure on channel(s) {names}: the report is off, or nothing hit"
        )
        f = Finding(kind="cache_report_off", severity=WARNING, title=title)
        f.summary.append(
            "no response on these channels carried a cached-token figure, so their hit rate "
            "cannot be measured (and clients see no cache reads); they are left out of the "
            "slice comparison"
        )
        f.summary += [
            f"{ch or '(none)'}: {ev.detail} (evidence: {ev.source})" for ch, (_, ev) in off.items()
        ]
        f.fix = [
            "vLLM: start the server with `--enable-prompt-tokens-details`",
            "SGLang: start the server with `--enable-cache-report`",
        ]
        if not sure:
            f.fix.append(
                "to tell the two apart: `prefixgate doctor --probe` (two identical requests, "
                "the second must hit) or the engine's /metrics (`metrics_url` on the channel); "
                "vLLM before 0.32 omits the figure when it is 0"
            )
        f.evidence.append(_table(off))
        f.facts = {"channels": _facts(off)}
        out.append(f)
    if hit:
        names = ", ".join(ch or "(none)" for ch in hit)
        f = Finding(
            kind="cache_report_absent",
            severity=INFO,
            title=f"no cached-token figure on channel(s) {names} because nothing hit, not "
            "because the report is off",
        )
        f.summary.append(
            "vLLM releases before 0.32 leave `prompt_tokens_details` out when nothing hit; "
            "these channels' requests are counted with 0 cached tokens"
        )
        f.summary += [
            f"{ch or '(none)'}: {ev.detail} (evidence: {ev.source})" for ch, (_, ev) in hit.items()
        ]
        f.evidence.append(_table(hit))
        f.facts = {"channels": _facts(hit)}
        out.append(f)
    return out


def _table(channels: dict[str | None, tuple[int, Evidence]]) -> Table:
    return Table(
        "requests without cached_tokens",
        ["channel", "requests", "verdict", "evidence"],
        [
            [ch or "(none)", n, ev.verdict, ev.source]
            for ch, (n, ev) in sorted(channels.items(), key=str)
        ],
    )


def _facts(channels: dict[str | None, tuple[int, Evidence]]) -> dict:
    return {
        str(ch): {"requests": n, "verdict": ev.verdict, "evidence": ev.source, "detail": ev.detail}
        for ch, (n, ev) in channels.items()
    }


__all__ = ["Evidence", "finding", "from_metrics", "from_records", "probe", "probe_all"]
