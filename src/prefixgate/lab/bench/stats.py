"""Benchmark metrics with ``vllm bench serve``'s definitions and JSON key names.

Per request (see :class:`~prefixgate.lab.bench.specs.RequestResult`): TTFT, TPOT =
(E2EL - TTFT) / (output_tokens - 1), ITL (every gap between successive chunks), E2EL.
Over a run: mean / median / std / percentiles (numpy's default linear interpolation) of
each, in milliseconds under ``mean_ttft_ms``, ``median_ttft_ms``, ``p99_ttft_ms`` ...;
TPOT is averaged over requests with more than one output token; ITL gaps are pooled over
all requests. Throughputs divide by the run's wall duration. Goodput counts requests whose
TTFT, TPOT (0 for 1-token outputs) and E2EL are all within the given SLOs (milliseconds).
Empty series give 0.0, as vLLM reports them. Additions under our own names:
``*_ttft_visible_ms`` (first non-reasoning token), ``decode_tok_s`` (1000 / mean TPOT),
``total_cached_tokens`` and ``usage_cache_hit_rate`` (from usage, percent),
``requests_without_usage`` and ``outputs_below_max_tokens`` (what to distrust).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .specs import RequestResult

__all__ = [
    "DEFAULT_PERCENTILES",
    "SLO_KEYS",
    "goodput_count",
    "parse_percentiles",
    "parse_slo",
    "peak_concurrency",
    "percentile",
    "series_stats",
    "summarize",
]

DEFAULT_PERCENTILES: tuple[float, ...] = (99.0,)
SLO_KEYS = ("ttft", "tpot", "e2el")


def percentile(values: Sequence[float], p: float) -> float:
    """numpy's default (``method="linear"``): rank ``p/100 * (n-1)``, interpolated."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be in [0, 100], not {p}")
    data = sorted(values)
    rank = (len(data) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(data) - 1)
    frac = rank - lo
    return data[lo] + (data[hi] - data[lo]) * frac


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _std(values: Sequence[float]) -> float:
    m = _mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / len(values))


def pct_name(p: float) -> str:
    """99 -> "p99", 99.9 -> "p99.9" (vLLM's key spelling)."""
    return f"p{int(p)}" if float(p).is_integer() else f"p{p}"


def series_stats(
    name: str, seconds: Sequence[float], percentiles: Iterable[float]
) -> dict[str, float]:
    """``mean_<name>_ms``, ``median_<name>_ms``, ``std_<name>_ms``, ``p<P>_<name>_ms``."""
    ms = [s * 1000.0 for s in seconds]
    out: dict[str, float] = {
        f"mean_{name}_ms": _mean(ms) if ms else 0.0,
        f"median_{name}_ms": percentile(ms, 50) if ms else 0.0,
        f"std_{name}_ms": _std(ms) if ms else 0.0,
    }
    for p in percentiles:
        out[f"{pct_name(p)}_{name}_ms"] = percentile(ms, p) if ms else 0.0
    return out


def goodput_count(results: Iterable[RequestResult], slo_ms: Mapping[str, float]) -> int:
    """Successful requests meeting every SLO given (keys ``ttft``, ``tpot``, ``e2el``;
    milliseconds; a value equal to the SLO meets it)."""
    good = 0
    for r in results:
        if not r.success:
            continue
        measured = {"ttft": r.ttft, "tpot": r.tpot() or 0.0, "e2el": r.latency}
        if all(measured[k] * 1000.0 <= v for k, v in slo_ms.items()):
            good += 1
    return good


def peak_concurrency(results: Iterable[RequestResult]) -> int:
    """The most requests in flight at once (half-open [start, start + E2EL))."""
    events: list[tuple[float, int]] = []
    for r in results:
        if r.success:
            events.append((r.start, 1))
            events.append((r.start + r.latency, -1))
    events.sort()
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


def summarize(
    results: Sequence[RequestResult],
    duration_s: float,
    *,
    percentiles: Iterable[float] = DEFAULT_PERCENTILES,
    slo_ms: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The run's metrics under vLLM's keys (plus the additions named in the module doc)."""
    percentiles = tuple(percentiles)
    ok = [r for r in results if r.success]
    dur = duration_s if duration_s > 0 else float("nan")
    total_in = sum(r.input_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    total_cached = sum(r.cached_tokens for r in ok)
    tpots = [t for r in ok if (t := r.tpot()) is not None]
    visible = [r.ttft_visible for r in ok if r.ttft_visible is not None]
    itls = [gap for r in ok for gap in r.itl]
    out: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur if ok else 0.0,
        "request_goodput": (goodput_count(ok, slo_ms) / dur if ok else 0.0) if slo_ms else None,
        "output_throughput": total_out / dur if ok else 0.0,
        "total_token_throughput": (total_in + total_out) / dur if ok else 0.0,
        "max_concurrent_requests": peak_concurrency(ok),
    }
    out |= series_stats("ttft", [r.ttft for r in ok], percentiles)
    out |= series_stats("tpot", tpots, percentiles)
    out |= series_stats("itl", itls, percentiles)
    out |= series_stats("e2el", [r.latency for r in ok], percentiles)
    if visible:
        out |= series_stats("ttft_visible", visible, percentiles)
    mean_tpot = out["mean_tpot_ms"]
    out["decode_tok_s"] = 1000.0 / mean_tpot if mean_tpot > 0 else None
    out["total_cached_tokens"] = total_cached
    out["usage_cache_hit_rate"] = 100.0 * total_cached / total_in if total_in else None
    out["requests_without_usage"] = sum(1 for r in ok if not r.usage_seen)
    # the server stopped before max_tokens (no ignore_eos, e.g. Anthropic): fewer tokens
    out["outputs_below_max_tokens"] = sum(1 for r in ok if 0 < r.output_tokens < r.max_tokens)
    out["errors"] = [r.error for r in results if not r.success]
    return out


_SLO_ITEM = re.compile(r"^\s*(ttft|tpot|e2el)(?:_ms)?\s*[=:]\s*([0-9.]+)\s*$")


def parse_slo(text: str | None) -> dict[str, float]:
    """``"ttft_ms=500,tpot_ms=50"`` (or vLLM's ``"ttft:500 tpot:50"``) -> ``{"ttft": 500.0,
    "tpot": 50.0}``."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for item in re.split(r"[,\s]+", text.strip()):
        if not item:
            continue
        m = _SLO_ITEM.match(item)
        if not m:
            raise ValueError(f"bad SLO {item!r}: use ttft_ms=…, tpot_ms=…, e2el_ms=…")
        value = float(m.group(2))
        if value <= 0:
            raise ValueError(f"SLO {item!r} must be positive")
        out[m.group(1)] = value
    return out


def parse_percentiles(text: str | None) -> tuple[float, ...]:
    """``"50,90,99"`` -> ``(50.0, 90.0, 99.0)``."""
    if not text:
        return DEFAULT_PERCENTILES
    values = tuple(float(x) for x in re.split(r"[,\s]+", text.strip()) if x)
    for v in values:
        if not 0 <= v <= 100:
            raise ValueError(f"percentile {v} is outside [0, 100]")
    return values
