"""Upstream cache health: what the inference server itself says about its caches.

Sources: vLLM ``/metrics`` snapshots (two taken some seconds apart give deltas; one gives
the cumulative counters since start) and engine log files. The finding it exists for is
the second incident of the DeepSeek-on-vLLM deployment, a *write-only host-memory tier*: the ``OffloadingConnector``
stores KV blocks to CPU memory all the time (``kv_offload_total_bytes{GPU_to_CPU}`` grows,
external queries grow) but never loads one back (``CPU_to_GPU`` = 0, external hits = 0,
``External prefix cache hit rate: 0.0%`` in every log line). Known cause: hybrid KV cache
groups — sliding-window and EAGLE/MTP draft groups never offload their trailing chunk —
plus a lookup that vetoes the whole hit when any group misses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from prefixgate.doctor.findings import WARNING, Finding, Table

STORE_KEYS = ("kv_offload_total_bytes:GPU_to_CPU", "kv_offload_store_bytes")
LOAD_KEYS = ("kv_offload_total_bytes:CPU_to_GPU", "kv_offload_load_bytes")


@dataclass
class Counters:
    """The cache counters of one upstream, summed over other labels."""

    values: dict[str, float] = field(default_factory=dict)
    block_size: int | None = None

    def get(self, *keys: str) -> float:
        return sum(self.values.get(k, 0.0) for k in keys)


def _short(name: str) -> str:
    name = name.removeprefix("vllm:")
    for suffix in ("_total", "_created"):
        if name.endswith(suffix):
            return name[: -len(suffix)] if suffix == "_total" else ""
    return name


def parse_metrics(text: str) -> Counters:
    """Counters from one Prometheus exposition of a vLLM server."""
    out = Counters()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = _short(sample.name)
            if not name:
                continue
            if name == "cache_config_info":
                bs = sample.labels.get("block_size")
                if bs and bs.isdigit():
                    out.block_size = int(bs)
                continue
            key = name
            if "transfer_type" in sample.labels:
                key = f"{name}:{sample.labels['transfer_type']}"
            elif "source" in sample.labels:
                key = f"{name}:{sample.labels['source']}"
            out.values[key] = out.values.get(key, 0.0) + float(sample.value)
    return out


def delta(first: Counters, last: Counters) -> Counters:
    keys = set(first.values) | set(last.values)
    return Counters(
        {k: last.values.get(k, 0.0) - first.values.get(k, 0.0) for k in keys},
        last.block_size or first.block_size,
    )


@dataclass
class LogStats:
    rate_lines: int = 0
    external_zero_lines: int = 0
    external_nonzero_lines: int = 0
    prefix_rates: list[float] = field(default_factory=list)
    store_lines: int = 0
    load_lines: int = 0
    store_bytes_max: float = 0.0
    load_bytes_max: float = 0.0
    offloading_connector: bool = False
    draft_groups: bool = False
    sliding_window: bool = False
    min_gpu_usage_while_external_zero: float | None = None


_RATES = re.compile(
    r"Prefix cache hit rate: ([\d.]+)%.*?External prefix cache hit rate: ([\d.]+)%", re.I
)
_GPU = re.compile(r"GPU KV cache usage: ([\d.]+)%", re.I)
_STORE_BYTES = re.compile(r"(?:kv_offload_)?store_bytes[=:\s]+(\d+)")
_LOAD_BYTES = re.compile(r"(?:kv_offload_)?load_bytes[=:\s]+(\d+)")


def parse_log(lines: Iterable[str]) -> LogStats:
    st = LogStats()
    for line in lines:
        m = _RATES.search(line)
        if m:
            st.rate_lines += 1
            st.prefix_rates.append(float(m.group(1)))
            if float(m.group(2)) == 0.0:
                st.external_zero_lines += 1
                g = _GPU.search(line)
                if g:
                    v = float(g.group(1))
                    cur = st.min_gpu_usage_while_external_zero
                    st.min_gpu_usage_while_external_zero = v if cur is None else min(cur, v)
            else:
                st.external_nonzero_lines += 1
        if "store_bytes" in line:
            st.store_lines += 1
            m2 = _STORE_BYTES.search(line)
            if m2:
                st.store_bytes_max = max(st.store_bytes_max, float(m2.group(1)))
        if "load_bytes" in line:
            m3 = _LOAD_BYTES.search(line)
            if m3 is None or float(m3.group(1)) > 0:
                st.load_lines += 1
            if m3:
                st.load_bytes_max = max(st.load_bytes_max, float(m3.group(1)))
        if "OffloadingConnector" in line:
            st.offloading_connector = True
        if "EAGLE/MTP draft attention groups" in line or "draft attention groups" in line:
            st.draft_groups = True
        if "sliding_window" in line or "sliding window" in line.lower():
            st.sliding_window = True
    return st


_CAUSE = (
    "hybrid KV cache groups: sliding-window and EAGLE/MTP draft groups never offload their "
    "trailing chunk, and the connector's lookup vetoes the whole hit when any group misses "
    "(one group with zero hit chunks returns 0), so the full-attention prefix already in "
    "host memory is never loaded back"
)
_OPTIONS = [
    "fix the lookup (vLLM OffloadingConnector): when the full-attention group hits, load "
    "that prefix and recompute the sliding-window / draft part on the spot; or wait for upstream",
    "until then the host tier only costs memory and PCIe write bandwidth: releasing the "
    "pinned memory (dropping the OffloadingConnector) does not make the GPU cache worse",
    "success criteria: kv_offload CPU_to_GPU bytes > 0 and a non-zero External prefix cache "
    "hit rate when an evicted long prefix is sent again",
]


def metrics_finding(source: str, snapshots: Sequence[Counters]) -> Finding | None:
    """The write-only verdict for one upstream's metrics (first and last snapshot)."""
    if not snapshots:
        return None
    c = delta(snapshots[0], snapshots[-1]) if len(snapshots) > 1 else snapshots[0]
    stored = c.get(*STORE_KEYS)
    loaded = c.get(*LOAD_KEYS)
    ext_q = c.get("external_prefix_cache_queries")
    ext_h = c.get("external_prefix_cache_hits")
    by_ext = c.get("prompt_tokens_by_source:external_kv_transfer")
    if not (stored > 0 or ext_q > 0) or loaded > 0 or ext_h > 0 or by_ext > 0:
        return None
    q, h = c.get("prefix_cache_queries"), c.get("prefix_cache_hits")
    span = "between the snapshots" if len(snapshots) > 1 else "since the server started"
    rows = [
        ["GPU → CPU (store) bytes", f"{stored:,.0f}"],
        ["CPU → GPU (load) bytes", f"{loaded:,.0f}"],
        ["external prefix cache queries (tokens)", f"{ext_q:,.0f}"],
        ["external prefix cache hits (tokens)", f"{ext_h:,.0f}"],
    ]
    if q:
        rows.append(["GPU prefix cache hit rate", f"{h / q:.1%}"])
    return Finding(
        kind="l2_write_only",
        severity=WARNING,
        title=f"host-memory (L2) KV tier is write-only on {source}",
        summary=[
            f"{span}: {stored:,.0f} bytes stored to host memory, {loaded:,.0f} loaded back; "
            f"external cache hits {ext_h:,.0f} of {ext_q:,.0f} queried tokens",
            f"known cause: {_CAUSE}",
        ],
        fix=list(_OPTIONS),
        evidence=[Table(f"vLLM counters ({span})", ["counter", "value"], rows)],
        facts={
            "source": source,
            "store_bytes": stored,
            "load_bytes": loaded,
            "external_queries": ext_q,
            "external_hits": ext_h,
            "snapshots": len(snapshots),
            "block_size": c.block_size,
        },
    )


def log_finding(source: str, st: LogStats) -> Finding | None:
    writes = st.store_lines > 0 or st.offloading_connector
    if not st.rate_lines or st.external_nonzero_lines or st.load_lines or not writes:
        return None
    rows = [
        ["lines `External prefix cache hit rate: 0.0%`", st.external_zero_lines],
        ["lines with a non-zero External hit rate", st.external_nonzero_lines],
        ["store (GPU → CPU) lines", st.store_lines],
        ["load (CPU → GPU) lines", st.load_lines],
    ]
    if st.prefix_rates:
        rows.append(["GPU prefix cache hit rate (median line)", f"{_median(st.prefix_rates):.1f}%"])
    if st.store_bytes_max:
        rows.append(["largest store_bytes seen", f"{st.store_bytes_max:,.0f}"])
    if st.min_gpu_usage_while_external_zero is not None:
        rows.append(
            [
                "lowest GPU KV usage while External was 0.0%",
                f"{st.min_gpu_usage_while_external_zero}%",
            ]
        )
    hints = []
    if st.draft_groups:
        hints.append(
            "the log reports EAGLE/MTP draft attention groups (trailing chunk never offloaded)"
        )
    if st.sliding_window:
        hints.append("the model has sliding-window layers")
    return Finding(
        kind="l2_write_only",
        severity=WARNING,
        title=f"host-memory (L2) KV tier is write-only ({source})",
        summary=[
            f"{st.external_zero_lines} engine log lines report External prefix cache hit rate "
            f"0.0% and none another value, while {st.store_lines} lines show stores and "
            f"{st.load_lines} show loads",
            f"known cause: {_CAUSE}",
            *hints,
        ],
        fix=list(_OPTIONS),
        evidence=[Table("engine log", ["pattern", "count"], rows)],
        facts={
            "source": source,
            "external_zero_lines": st.external_zero_lines,
            "external_nonzero_lines": st.external_nonzero_lines,
            "store_lines": st.store_lines,
            "load_lines": st.load_lines,
            "draft_groups": st.draft_groups,
        },
    )


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


def fetch_metrics(url: str, *, timeout: float = 5.0) -> str:
    import httpx

    r = httpx.get(url, timeout=timeout)
    r.raise_for_status()
    return r.text
