"""The results, side by side: markdown (``report.md``), a rich terminal table, JSON with
``vllm bench serve``'s keys per configuration and scenario (``results.json``), CSV (one row
per configuration and scenario) and PNG plots (:mod:`.plots`).

The first table is the deployment report's: one row per configuration, one column per
scenario, each cell the scenario's headline (single-stream decode tok/s, aggregate tok/s,
cache hit %). The second holds latency and capacity: TTFT on a short prompt, long-prefill
TTFT cold and warm, the server's prefix-cache hit rate and speculative acceptance from
``/metrics``, the KV pool. Then one table per scenario with every metric.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .runner import BenchRun, TargetRun
from .stats import pct_name

__all__ = [
    "headline_rows",
    "problems",
    "to_csv",
    "to_json",
    "to_markdown",
    "to_rich_tables",
    "write_outputs",
]

_PERCENT_KEYS = {"usage_cache_hit_rate", "server_prefix_cache_hit_rate"}


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _cell(key: str, value: Any) -> str:
    if key in _PERCENT_KEYS and value is not None:
        return _fmt(value) + "%"
    return _fmt(value)


def server_totals(tr: TargetRun) -> dict[str, Any]:
    """Counter deltas summed over the target's scenarios."""
    q = h = acc = drafts = dtoks = 0
    have_cache = have_spec = False
    for sr in tr.scenarios.values():
        s = sr.summary
        if "server_prefix_cache_queries" in s:
            have_cache = True
            q += s["server_prefix_cache_queries"]
            h += s["server_prefix_cache_hits"]
        if "spec_decode_draft_tokens" in s:
            have_spec = True
            acc += s["spec_decode_accepted_tokens"]
            dtoks += s["spec_decode_draft_tokens"]
            drafts += s["spec_decode_num_drafts"]
    out: dict[str, Any] = {}
    if have_cache:
        out |= {
            "server_prefix_cache_queries": q,
            "server_prefix_cache_hits": h,
            "server_prefix_cache_hit_rate": 100.0 * h / q if q else None,
        }
    if have_spec:
        out |= {
            "spec_decode_acceptance_rate": 100.0 * acc / dtoks if dtoks else None,
            "spec_decode_acceptance_length": 1.0 + acc / drafts if drafts else None,
        }
    return out


# -- the two summary tables -------------------------------------------------------------------


def _get(tr: TargetRun, scenario: str, key: str) -> Any:
    sr = tr.scenarios.get(scenario)
    return None if sr is None or not sr.summary.get("completed") else sr.summary.get(key)


Column = tuple[str, Callable[[TargetRun], str]]


def _headline_columns(run: BenchRun) -> list[Column]:
    cols: list[Column] = []
    for name in run.scenario_names:
        title = headline = None
        for tr in run.targets:
            if name in tr.scenarios:
                title, headline = tr.scenarios[name].title, tr.scenarios[name].headline
                break
        if title is None or headline is None:
            continue
        cols.append((title, lambda tr, n=name, k=headline: _cell(k, _get(tr, n, k))))
    return cols


def _latency_columns(run: BenchRun) -> list[Column]:
    names = set(run.scenario_names)
    cols: list[Column] = []
    if "decode" in names:
        cols.append(
            ("TTFT short prompt (ms)", lambda tr: _fmt(_get(tr, "decode", "median_ttft_ms")))
        )
    if "thinking" in names:
        cols.append(
            (
                "Think-on visible TTFT (ms)",
                lambda tr: _fmt(_get(tr, "thinking", "median_ttft_visible_ms")),
            )
        )
    if "prefill" in names:
        cols += [
            ("Prefill TTFT cold (ms)", lambda tr: _fmt(_get(tr, "prefill", "ttft_cold_ms"))),
            ("Prefill TTFT warm (ms)", lambda tr: _fmt(_get(tr, "prefill", "ttft_warm_ms"))),
            ("Warm cached tokens", lambda tr: _fmt(_get(tr, "prefill", "cached_tokens_warm"))),
            (
                "Prefill tok/s (hit)",
                lambda tr: _fmt(_get(tr, "prefill", "prefill_tok_s_from_hit"), 0),
            ),
        ]
    totals = {tr.target.name: server_totals(tr) for tr in run.targets}
    if any("server_prefix_cache_hit_rate" in t for t in totals.values()):
        cols.append(
            (
                "Server prefix-cache hit %",
                lambda tr: _cell(
                    "server_prefix_cache_hit_rate",
                    totals[tr.target.name].get("server_prefix_cache_hit_rate"),
                ),
            )
        )
    if any("spec_decode_acceptance_length" in t for t in totals.values()):
        cols.append(
            (
                "Spec accept len",
                lambda tr: _fmt(totals[tr.target.name].get("spec_decode_acceptance_length"), 2),
            )
        )
        cols.append(
            (
                "Spec accept %",
                lambda tr: _fmt(totals[tr.target.name].get("spec_decode_acceptance_rate")),
            )
        )
    if any(tr.kv_capacity_tokens for tr in run.targets):
        cols.append(("KV pool (tokens)", lambda tr: _fmt(tr.kv_capacity_tokens)))
    cols.append(
        ("Failed", lambda tr: _fmt(sum(sr.summary["failed"] for sr in tr.scenarios.values())))
    )
    return cols


def headline_rows(run: BenchRun) -> tuple[list[str], list[list[str]]]:
    """The deployment report's table: header and one row per configuration."""
    cols = _headline_columns(run)
    rows = [[tr.target.name, *(f(tr) for _, f in cols)] for tr in run.targets]
    return ["Configuration", *(h for h, _ in cols)], rows


def _latency_rows(run: BenchRun) -> tuple[list[str], list[list[str]]]:
    cols = _latency_columns(run)
    rows = [[tr.target.name, *(f(tr) for _, f in cols)] for tr in run.targets]
    return ["Configuration", *(h for h, _ in cols)], rows


def _detail_keys(run: BenchRun, scenario: str) -> list[str]:
    # p50 is the median by definition: the JSON keeps both, the tables show one
    pcts = [pct_name(p) for p in run.meta.get("percentiles", [99]) if p != 50]
    keys = ["completed", "failed"]
    for m in ("ttft", "ttft_visible", "tpot", "itl", "e2el"):
        keys += [f"mean_{m}_ms", f"median_{m}_ms", *(f"{p}_{m}_ms" for p in pcts)]
    keys += [
        "decode_tok_s",
        "output_throughput",
        "total_token_throughput",
        "request_throughput",
        "request_goodput",
        "max_concurrent_requests",
        "total_input_tokens",
        "total_output_tokens",
        "total_cached_tokens",
        "usage_cache_hit_rate",
        "server_prefix_cache_hit_rate",
        "server_mean_ttft_ms",
        "server_mean_itl_ms",
        "server_mean_e2el_ms",
        "spec_decode_acceptance_rate",
        "spec_decode_acceptance_length",
    ]
    seen = set(keys)
    for tr in run.targets:
        sr = tr.scenarios.get(scenario)
        for k, v in sr.summary.items() if sr else ():
            skip = k.startswith(("std_", "p50_")) or k == "duration"
            if k not in seen and _scalar(v) and not skip:
                keys.append(k)
                seen.add(k)
    present = [
        k
        for k in keys
        if any(
            tr.scenarios.get(scenario) and tr.scenarios[scenario].summary.get(k) is not None
            for tr in run.targets
        )
    ]
    return present


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, int | float | str | bool)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _scenario_tables(run: BenchRun) -> list[tuple[str, list[str], list[list[str]]]]:
    out = []
    for name in run.scenario_names:
        keys = _detail_keys(run, name)
        header = ["Metric", *(tr.target.name for tr in run.targets)]
        rows = [
            [
                k,
                *(
                    _cell(k, (tr.scenarios[name].summary.get(k) if name in tr.scenarios else None))
                    for tr in run.targets
                ),
            ]
            for k in keys
        ]
        out.append((name, header, rows))
    return out


def to_markdown(run: BenchRun) -> str:
    parts = ["# prefixgate bench", ""]
    parts.append(
        f"Run `{run.meta['run_id']}` at {run.meta['date']}; scenarios: "
        + ", ".join(run.scenario_names)
        + ". Streaming, temperature 0, `ignore_eos` on OpenAI targets; decode tok/s = "
        "1000 / mean TPOT (excludes TTFT); token counts from the server's usage."
    )
    parts.append("")
    parts.append("| Configuration | API | URL | Model |")
    parts.append("| --- | --- | --- | --- |")
    for tr in run.targets:
        parts.append(
            f"| {tr.target.name} | {tr.target.api} | {tr.target.url} | {tr.model or '–'} |"
        )
    parts += ["", "## Throughput (tok/s; hit rates in %)", ""]
    parts.append(_md_table(*headline_rows(run)))
    parts += ["", "## Latency, cache and capacity", ""]
    parts.append(_md_table(*_latency_rows(run)))
    for name, header, rows in _scenario_tables(run):
        parts += ["", f"## {name}", "", _md_table(header, rows)]
    for tr in run.targets:
        sr = tr.scenarios.get("agent")
        if sr and sr.summary.get("agent_turns"):
            parts += ["", f"### agent turns: {tr.target.name}", ""]
            header = ["Turn", "Requests", "Input tokens", "Cached tokens", "TTFT (ms)"]
            rows = [
                [str(t["turn"]), str(t["requests"]), _fmt(t["mean_input_tokens"], 0),
                 _fmt(t["mean_cached_tokens"], 0), _fmt(t["mean_ttft_ms"])]
                for t in sr.summary["agent_turns"]
            ]  # fmt: skip
            parts.append(_md_table(header, rows))
    errors, notes = problems(run)
    if errors:
        parts += ["", "## Errors", "", *errors]
    if notes:
        parts += ["", "## Notes", "", *notes]
    return "\n".join(parts) + "\n"


def problems(run: BenchRun) -> tuple[list[str], list[str]]:
    """Markdown bullets: errors (failed targets and requests), and notes on figures to
    distrust (outputs cut short, responses without usage)."""
    errors, notes = [], []
    for tr in run.targets:
        if tr.error:
            errors.append(f"- **{tr.target.name}**: {tr.error}")
        for sr in tr.scenarios.values():
            msgs = sr.summary.get("errors") or []
            if msgs:
                first = "; ".join(sorted(set(msgs))[:3])
                errors.append(f"- **{tr.target.name} / {sr.name}**: {len(msgs)} failed: {first}")
            notes += _notes(tr, sr)
    return errors, notes


def _notes(tr: TargetRun, sr: Any) -> list[str]:
    s, out = sr.summary, []
    short = [r for r in sr.requests if r.success and 0 < r.output_tokens < r.max_tokens]
    if short:
        got = sum(r.output_tokens for r in short) / len(short)
        want = sum(r.max_tokens for r in short) / len(short)
        why = {
            "anthropic": " (Anthropic has no ignore_eos)",
            "responses": " (the Responses API has no ignore_eos)",
        }.get(tr.target.api, "")
        out.append(
            f"- {tr.target.name} / {sr.name}: {len(short)} of {s['completed']} outputs stopped "
            f"before max_tokens (mean {got:.0f} of {want:.0f} tokens){why}; rates are over "
            "fewer tokens."
        )
    itl = s.get("median_itl_ms")
    long_outputs = s.get("completed") and s["total_output_tokens"] > 16 * s["completed"]
    has_gaps = any(r.itl for r in sr.requests)
    if long_outputs and has_gaps and itl is not None and itl < 0.1:
        out.append(
            f"- {tr.target.name} / {sr.name}: the output arrived in bursts (median ITL "
            f"{itl:.3f} ms): something buffered the stream, so decode tok/s measures delivery, "
            "not generation (compare server_mean_itl_ms)."
        )
    if s.get("requests_without_usage"):
        out.append(
            f"- {tr.target.name} / {sr.name}: {s['requests_without_usage']} responses had no "
            "usage; their output counts are chunk counts (a lower bound)."
        )
    return out


def to_rich_tables(run: BenchRun) -> list[Any]:
    from rich.table import Table

    tables = []
    for title, (header, rows) in (
        ("Throughput (tok/s; hit rates in %)", headline_rows(run)),
        ("Latency, cache and capacity", _latency_rows(run)),
    ):
        table = Table(title=title, title_justify="left")
        for i, h in enumerate(header):
            table.add_column(h, justify="left" if i == 0 else "right", overflow="fold")
        for row in rows:
            table.add_row(*row)
        tables.append(table)
    return tables


def to_json(run: BenchRun) -> dict[str, Any]:
    targets: dict[str, Any] = {}
    for tr in run.targets:
        targets[tr.target.name] = {
            "url": tr.target.url,
            "api": tr.target.api,
            "metrics_url": tr.target.scrape_url(),
            "model": tr.model,
            "error": tr.error,
            "kv_capacity_tokens": tr.kv_capacity_tokens,
            "server_totals": server_totals(tr),
            "scenarios": {
                name: {**sr.summary, "requests": [r.row() for r in sr.requests]}
                for name, sr in tr.scenarios.items()
            },
        }
    return {"meta": run.meta, "targets": targets}


def to_csv(run: BenchRun) -> str:
    rows: list[dict[str, Any]] = []
    keys: list[str] = []
    for tr in run.targets:
        for name, sr in tr.scenarios.items():
            row = {
                "configuration": tr.target.name,
                "api": tr.target.api,
                "url": tr.target.url,
                "model": tr.model,
                "scenario": name,
            }
            row |= {k: v for k, v in sr.summary.items() if _scalar(v)}
            for k in row:
                if k not in keys:
                    keys.append(k)
            rows.append(row)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    return buf.getvalue()


def write_outputs(run: BenchRun, out_dir: str | Path, *, plots: bool = True) -> list[Path]:
    """report.md, results.json, results.csv and the PNG plots; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (
        ("report.md", to_markdown(run)),
        ("results.json", json.dumps(to_json(run), indent=2, default=str) + "\n"),
        ("results.csv", to_csv(run)),
    ):
        path = out / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    if plots:
        from .plots import write_plots

        written += write_plots(run, out)
    return written
