"""The server's own counters: ``/metrics`` (Prometheus text) read before and after a
scenario, and the deltas that matter for the comparison.

Prefix cache: ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total``
(tokens; older vLLM: ``vllm:gpu_prefix_cache_*``). Speculative decoding:
``vllm:spec_decode_num_accepted_tokens_total``, ``..._num_draft_tokens_total``,
``..._num_drafts_total`` -> acceptance rate (percent, accepted / draft tokens) and mean
acceptance length (1 + accepted / drafts), the figures ``vllm bench serve`` prints. KV
pool capacity: ``vllm:cache_config_info``'s ``num_gpu_blocks`` x ``block_size``. The
server's own view of latency, from histogram ``_sum`` / ``_count`` deltas:
``server_mean_ttft_ms``, ``server_mean_itl_ms``, ``server_mean_e2el_ms`` (a client figure
far above the server's points at the network, a proxy, or a buffered stream). Series
are summed over their labels (several models or engines behind one server). A server
without these series (the gateway, SGLang) simply gives no figures.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Snapshot", "counter_deltas", "parse_metrics", "scrape"]

_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
_DRAFTS = "vllm:spec_decode_num_drafts_total"
_HISTOGRAMS = (  # (our key, vLLM's histogram names: newest first)
    ("server_mean_ttft_ms", ("vllm:time_to_first_token_seconds",)),
    (
        "server_mean_itl_ms",
        ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    ),
    ("server_mean_e2el_ms", ("vllm:e2e_request_latency_seconds",)),
)
_PROMPT = "vllm:prompt_tokens_total"
_GENERATION = "vllm:generation_tokens_total"


@dataclass
class Snapshot:
    """Sample values summed per sample name, and the KV pool capacity if exposed."""

    values: dict[str, float] = field(default_factory=dict)
    kv_capacity_tokens: int | None = None

    def get(self, *names: str) -> float | None:
        for name in names:
            if name in self.values:
                return self.values[name]
        return None


def parse_metrics(text: str) -> Snapshot:
    values: dict[str, float] = defaultdict(float)
    capacity: int | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] += sample.value
            if sample.name == "vllm:cache_config_info":
                try:
                    blocks = int(sample.labels.get("num_gpu_blocks", ""))
                    size = int(sample.labels.get("block_size", ""))
                except ValueError:
                    continue
                capacity = (capacity or 0) + blocks * size
    return Snapshot(dict(values), capacity)


async def scrape(http: httpx.AsyncClient, url: str | None) -> Snapshot | None:
    """The server's counters, or None when it has no readable ``/metrics``."""
    if not url:
        return None
    try:
        response = await http.get(url, timeout=10.0)
        if response.status_code != 200:
            return None
        return parse_metrics(response.text)
    except (httpx.HTTPError, ValueError):
        return None


def counter_deltas(before: Snapshot | None, after: Snapshot | None) -> dict[str, Any]:
    """The figures of one scenario (empty when the server exposes none). Keys:
    ``server_prefix_cache_queries``, ``server_prefix_cache_hits``,
    ``server_prefix_cache_hit_rate`` (percent), ``server_prompt_tokens``,
    ``server_generation_tokens``, ``server_mean_{ttft,itl,e2el}_ms`` and vLLM's
    ``spec_decode_*`` keys."""
    if before is None or after is None:
        return {}
    out: dict[str, Any] = {}

    def delta(*names: str) -> float | None:
        a, b = after.get(*names), before.get(*names)
        if a is None:
            return None
        return a - (b or 0.0)

    queries, hits = delta(*_QUERIES), delta(*_HITS)
    if queries is not None and hits is not None:
        out["server_prefix_cache_queries"] = int(queries)
        out["server_prefix_cache_hits"] = int(hits)
        out["server_prefix_cache_hit_rate"] = 100.0 * hits / queries if queries > 0 else None
    for key, name in (("server_prompt_tokens", _PROMPT), ("server_generation_tokens", _GENERATION)):
        value = delta(name)
        if value is not None:
            out[key] = int(value)
    for key, names in _HISTOGRAMS:
        total = delta(*(n + "_sum" for n in names))
        count = delta(*(n + "_count" for n in names))
        if total is not None and count:
            out[key] = 1000.0 * total / count
    accepted, draft_tokens, drafts = delta(_ACCEPTED), delta(_DRAFT_TOKENS), delta(_DRAFTS)
    if accepted is not None and draft_tokens is not None and draft_tokens > 0:
        out["spec_decode_acceptance_rate"] = 100.0 * accepted / draft_tokens
        out["spec_decode_acceptance_length"] = 1.0 + accepted / drafts if drafts else None
        out["spec_decode_num_drafts"] = int(drafts or 0)
        out["spec_decode_draft_tokens"] = int(draft_tokens)
        out["spec_decode_accepted_tokens"] = int(accepted)
    return out
