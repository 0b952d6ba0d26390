"""Prometheus metrics of the simulated upstream, under vLLM's names.

State is plain numbers on one :class:`SimMetrics` per app; the prefix-cache counters are
read from the :class:`~prefixgate.cache.PrefixCache` itself at scrape time. Exposition goes
through ``prometheus_client`` with a per-app ``CollectorRegistry`` (never the global one:
several simulated upstreams run in one process).

Series (each with a ``model_name`` label):

- counters ``vllm:prefix_cache_queries_total``, ``vllm:prefix_cache_hits_total`` (tokens),
  ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
  ``vllm:prompt_tokens_cached_total``,
  ``vllm:prompt_tokens_by_source_total{source=local_compute|local_cache_hit|external_kv_transfer}``,
  ``vllm:request_success_total{finished_reason=stop|length|abort|error}``;
- gauges ``vllm:kv_cache_usage_perc``, ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:cache_config_info{block_size=...,...} 1``;
- histograms ``vllm:time_to_first_token_seconds``, ``vllm:e2e_request_latency_seconds``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from prefixgate.cache import PrefixCache

__all__ = ["CONTENT_TYPE", "FINISH_REASONS", "Histogram", "SimMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
FINISH_REASONS = ("stop", "length", "abort", "error")
# vLLM's buckets for time to first token and end-to-end latency (seconds)
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


@dataclass(slots=True)
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for le, c in zip(self.buckets, self.counts, strict=True):
            acc += c
            out.append((repr(float(le)), acc))
        out.append(("+Inf", self.count))
        return out


@dataclass(eq=False)
class SimMetrics:
    """The counters one simulated upstream keeps, and their Prometheus exposition."""

    model_name: str
    cache: PrefixCache
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    running: int = 0
    waiting: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))

    def __post_init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def finish(self, reason: str, completion_tokens: int, seconds: float) -> None:
        """A request ended (``reason``: stop, length, abort or error)."""
        self.finished[reason] = self.finished.get(reason, 0) + 1
        self.generation_tokens += completion_tokens
        self.e2e.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # prometheus_client's collector protocol
    def collect(self) -> Iterator[Metric]:
        label = [self.model_name]
        names = ["model_name"]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            m = CounterMetricFamily(name, doc, labels=names)
            m.add_metric(label, value)
            return m

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            m = GaugeMetricFamily(name, doc, labels=names)
            m.add_metric(label, value)
            return m

        cache = self.cache
        yield counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of tokens.", cache.queries
        )
        yield counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of tokens.", cache.hits
        )
        yield counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens
        )
        yield counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            self.generation_tokens,
        )
        yield counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens.", self.cached_tokens
        )
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            labels=[*names, "source"],
        )
        by_source.add_metric([*label, "local_compute"], self.prompt_tokens - self.cached_tokens)
        by_source.add_metric([*label, "local_cache_hit"], self.cached_tokens)
        by_source.add_metric([*label, "external_kv_transfer"], 0)
        yield by_source
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*names, "finished_reason"],
        )
        for reason, n in self.finished.items():
            success.add_metric([*label, reason], n)
        yield success
        yield gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", cache.usage
        )
        yield gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            self.running,
        )
        yield gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", self.waiting
        )
        cap = cache.capacity_tokens
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "cache_dtype", "enable_prefix_caching", "num_gpu_blocks"],
        )
        blocks = "None" if cap is None else str(cap // cache.block_size)
        info.add_metric([str(cache.block_size), "auto", "True", blocks], 1)
        yield info
        for name, doc, hist in (
            (
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                self.ttft,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                self.e2e,
            ),
        ):
            h = HistogramMetricFamily(name, doc, labels=names)
            h.add_metric(label, hist.cumulative(), sum_value=hist.total)
            yield h
