"""Presenting a :class:`SimulationResult`: a text table, JSON, and a PNG of a sweep."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .replay import Run, Stats

__all__ = ["SimulationResult", "format_tokens", "plot_sweep", "render_text", "to_json"]


@dataclass(slots=True)
class SimulationResult:
    """Runs over one input: one run, a capacity sweep, or a scenario's variants."""

    source: dict[str, Any]
    runs: list[Run]
    sweep: bool = False
    scenario: str | None = None
    description: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def main(self) -> Run:
        return self.runs[-1] if self.sweep else self.runs[0]

    def run(self, label: str) -> Run:
        for r in self.runs:
            if r.label == label:
                return r
        raise KeyError(label)


def format_tokens(n: int | float | None) -> str:
    """``2097152`` → ``2M``; ``None`` → ``unlimited``."""
    if n is None:
        return "unlimited"
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % (size // 16) == 0:
            v = n / size
            return f"{v:g}{unit}"
    return f"{int(n):,}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _int(x: int | None) -> str:
    return "-" if x is None else f"{x:,}"


def _bytes(x: int | None) -> str:
    if x is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if x >= size:
            return f"{x / size:.1f} {unit}"
    return f"{x} B"


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f} s"


Row = tuple[str, Callable[[Run], str]]


def _rows(result: SimulationResult) -> list[Row]:
    has_ids = any(r.stats.ids_total for r in result.runs)
    has_host = any(r.config.host for r in result.runs)
    has_rate = any(r.config.prefill_rate for r in result.runs)

    def blocks(r: Run, k: int) -> str:
        return _pct(r.stats.block_hit_rates(r.config.block_size)[k])

    rows: list[Row] = [
        ("GPU capacity", lambda r: format_tokens(r.config.gpu_capacity_tokens)),
    ]
    if has_host:
        rows += [
            (
                "Host capacity",
                lambda r: format_tokens(r.config.host_capacity_tokens) if r.config.host else "none",
            ),
            ("Lookup policy", lambda r: r.config.policy),
        ]
    rows += [
        ("Requests", lambda r: _int(r.stats.requests)),
        ("Prompt tokens", lambda r: _int(r.stats.prompt_tokens)),
    ]
    if has_ids:
        rows += [
            ("Block hit ratio, trace ids as given", lambda r: _pct(r.stats.id_hit_ratio)),
            ("  mean per request", lambda r: _pct(r.stats.mean_request_id_ratio)),
        ]
    rows += [
        ("Token hit rate, vLLM rules (total)", lambda r: _pct(r.stats.token_hit_rate)),
        ("  GPU", lambda r: _pct(r.stats.gpu_token_hit_rate)),
    ]
    if has_host:
        rows.append(("  host", lambda r: _pct(r.stats.host_token_hit_rate)))
    rows += [
        ("  mean per request", lambda r: _pct(r.stats.mean_request_token_hit_rate)),
        ("Block hit rate, vLLM rules (total)", lambda r: blocks(r, 2)),
        ("  GPU", lambda r: blocks(r, 0)),
    ]
    if has_host:
        rows += [
            ("  host", lambda r: blocks(r, 1)),
            ("External hit rate", lambda r: _pct(r.stats.external_hit_rate)),
            ("Host writes (blocks)", lambda r: _int(r.stats.host_stores)),
            ("Host reads (blocks)", lambda r: _int(r.stats.host_loads)),
        ]
        if any(r.stats.host_store_bytes is not None for r in result.runs):
            rows += [
                ("Host write bytes", lambda r: _bytes(r.stats.host_store_bytes)),
                ("Host read bytes", lambda r: _bytes(r.stats.host_load_bytes)),
            ]
        if any(r.stats.recompute_tokens for r in result.runs):
            rows.append(("Recomputed after load", lambda r: _int(r.stats.recompute_tokens)))
    rows += [
        ("Prefill tokens computed", lambda r: _int(r.stats.computed_tokens)),
        ("GPU blocks evicted", lambda r: _int(r.stats.gpu_evicted_blocks)),
    ]
    if any(r.stats.incomplete_requests for r in result.runs):
        rows.append(("Requests that did not fit", lambda r: _int(r.stats.incomplete_requests)))
    if has_rate:
        rows += [
            ("Prefill seconds", lambda r: _secs(r.stats.prefill_seconds)),
            ("Prefill seconds saved", lambda r: _secs(r.stats.prefill_seconds_saved)),
        ]
    return rows


def _table(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = []
    for n, row in enumerate([header, *body]):
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_text(result: SimulationResult) -> str:
    """A plain-text report: the source, then one column per run."""
    src = result.source
    first = result.runs[0].config
    head = [
        f"Source: {src.get('kind')} {src.get('name')} ({src.get('requests', 0):,} requests"
        + (f", {src['skipped']:,} skipped" if src.get("skipped") else "")
        + ")",
        f"Block size {first.block_size}, KV groups {first.as_dict()['groups']}"
        + (", timed" if first.timed else ", untimed"),
    ]
    if result.scenario:
        head.insert(
            0,
            f"Scenario: {result.scenario}"
            + (f" - {result.description}" if result.description else ""),
        )
    header = ["", *(r.label for r in result.runs)]
    body = [[name, *(fmt(r) for r in result.runs)] for name, fmt in _rows(result)]
    out = "\n".join(head) + "\n\n" + _table(header, body)
    if result.notes:
        out += "\n\n" + "\n".join(result.notes)
    return out + "\n"


def _stats_json(stats: Stats, block_size: int) -> dict[str, Any]:
    return stats.as_dict(block_size)


def to_json(result: SimulationResult, *, per_request: bool = False, indent: int | None = 2) -> str:
    """The result as JSON: source, one object per run (config + aggregates, and with
    ``per_request`` every request's row)."""
    runs = []
    for r in result.runs:
        item: dict[str, Any] = {
            "label": r.label,
            "config": r.config.as_dict(),
            "aggregate": _stats_json(r.stats, r.config.block_size),
        }
        if r.stats.ids_total:
            item["conventions"] = {
                "block_hit_ratio_ids_as_given": r.stats.id_hit_ratio,
                "token_hit_rate_vllm": r.stats.token_hit_rate,
            }
        if per_request:
            item["requests"] = [
                {
                    "index": row.index,
                    "arrival": row.arrival,
                    "prompt_tokens": row.prompt_tokens,
                    "gpu_hit_tokens": row.gpu_hit_tokens,
                    "host_hit_tokens": row.host_hit_tokens,
                    "recompute_tokens": row.recompute_tokens,
                    "computed_tokens": row.computed_tokens,
                    "ids": row.ids,
                    "ids_hit": row.ids_hit,
                }
                for row in r.rows
            ]
        runs.append(item)
    doc: dict[str, Any] = {
        "source": result.source,
        "scenario": result.scenario,
        "sweep": result.sweep,
        "runs": runs,
        "notes": result.notes,
    }
    return json.dumps(doc, indent=indent)


def plot_sweep(result: SimulationResult, path: str | Path) -> Path:
    """Hit rates against GPU capacity, one line per measure, as a PNG (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.figure import Figure

    runs = [r for r in result.runs if r.config.gpu_capacity_tokens is not None]
    if not runs:
        runs = result.runs
    xs = [r.config.gpu_capacity_tokens or 0 for r in runs]
    fig: Figure = plt.figure(figsize=(8, 5), dpi=100)
    try:
        ax = fig.add_subplot(1, 1, 1)
        series: list[tuple[str, Callable[[Stats], float]]] = [
            ("total (vLLM tokens)", lambda s: s.token_hit_rate)
        ]
        if any(r.config.host for r in runs):
            series += [
                ("GPU tier", lambda s: s.gpu_token_hit_rate),
                ("host tier", lambda s: s.host_token_hit_rate),
            ]
        if any(r.stats.ids_total for r in runs):
            series.append(("trace ids as given", lambda s: s.id_hit_ratio or 0.0))
        for name, get in series:
            ax.plot(xs, [100 * get(r.stats) for r in runs], marker="o", label=name)
        if len(set(xs)) > 1 and min(xs) > 0:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([format_tokens(x) for x in xs], rotation=45)
        ax.set_xlabel("GPU KV capacity (tokens)")
        ax.set_ylabel("hit rate (%)")
        ax.set_ylim(0, 100)
        ax.grid(True, alpha=0.3)
        ax.legend()
        ax.set_title(f"Prefix-cache hit rate vs GPU capacity: {result.source.get('name')}")
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path
