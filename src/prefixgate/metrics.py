"""Prometheus metrics of the gateway, one registry per app (never the global one).

Fed from each finished record, so the metrics and the store can never disagree; the
writer's own counters are read at scrape time.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from prefixgate.record import Record

LABELS = ("channel", "entry", "model", "client")
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)


class _WriterCollector:
    def __init__(self, writer) -> None:
        self.writer = writer

    def collect(self):
        stats = getattr(self.writer, "stats", None)
        if stats is None:
            return
        s = stats()
        for name, value, doc in (
            ("prefixgate_record_pending", s.pending, "Records not yet in the store."),
            ("prefixgate_records_written", s.written, "Records written to the store."),
            (
                "prefixgate_records_dropped",
                s.dropped,
                "Records dropped (the journal full or failing).",
            ),
            (
                "prefixgate_records_rejected",
                s.rejected,
                "Records the store refused for their data.",
            ),
            ("prefixgate_record_journal_bytes", s.journal_bytes, "Bytes in the record journal."),
            ("prefixgate_store_up", int(s.store_ok), "1 when the last store write succeeded."),
        ):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g


class GatewayMetrics:
    def __init__(self, writer=None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "prefixgate_requests", "Requests by outcome.", (*LABELS, "status"), registry=r
        )
        self.prompt = Counter(
            "prefixgate_prompt_tokens",
            "Upstream prompt tokens (cached included).",
            LABELS,
            registry=r,
        )
        self.cached = Counter(
            "prefixgate_cached_tokens", "Upstream cached prompt tokens.", LABELS, registry=r
        )
        self.completion = Counter(
            "prefixgate_completion_tokens", "Upstream completion tokens.", LABELS, registry=r
        )
        self.hit_rate = Gauge(
            "prefixgate_prefix_hit_rate",
            "Token-weighted prefix-cache hit rate since start.",
            LABELS,
            registry=r,
        )
        self.latency = Histogram(
            "prefixgate_request_seconds",
            "End-to-end latency.",
            ("channel", "entry"),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "prefixgate_ttft_seconds",
            "Time to first content byte.",
            ("channel", "entry"),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_errors = Counter(
            "prefixgate_upstream_errors",
            "Failed attempts and failed requests by error type.",
            ("channel", "error"),
            registry=r,
        )
        self.retries = Counter(
            "prefixgate_failovers",
            "Attempts that failed over to another target.",
            ("entry",),
            registry=r,
        )
        self._totals: dict[tuple, list[int]] = {}
        self._children: dict[tuple, object] = {}
        if writer is not None:
            r.register(_WriterCollector(writer))

    def _child(self, metric, *labels: str):
        """``metric.labels(*labels)``, looked up once per label set (prometheus_client's
        own lookup takes a lock and rebuilds the key on every call)."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            if len(self._children) > 10_000:
                self._children.clear()
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe(self, rec: Record) -> None:
        labels = (
            rec.channel or "-",
            rec.endpoint or "-",
            rec.requested_model or "-",
            rec.client or "-",
        )
        child = self._child
        child(self.requests, *labels, str(rec.status)).inc()
        if rec.retries:
            child(self.retries, labels[1]).inc(rec.retries)
        if rec.error_type and rec.status >= 500:
            child(self.upstream_errors, labels[0], rec.error_type).inc()
        if rec.prompt_tokens:
            cached = rec.cached_tokens or 0
            child(self.prompt, *labels).inc(rec.prompt_tokens)
            child(self.cached, *labels).inc(cached)
            tot = self._totals.setdefault(labels, [0, 0])
            tot[0] += rec.prompt_tokens
            tot[1] += cached
            child(self.hit_rate, *labels).set(tot[1] / tot[0])
        if rec.completion_tokens:
            child(self.completion, *labels).inc(rec.completion_tokens)
        if rec.latency_ms is not None:
            child(self.latency, labels[0], labels[1]).observe(rec.latency_ms / 1000)
        if rec.ttft_ms is not None:
            child(self.ttft, labels[0], labels[1]).observe(rec.ttft_ms / 1000)

    def render(self) -> bytes:
        return generate_latest(self.registry)
