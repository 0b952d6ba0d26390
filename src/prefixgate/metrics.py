"""Prometheus metrics of the gateway, one registry per app (never the global one).

Fed from each finished record, so the metrics and the store can never disagree; the
writer's own counters are read at scrape time.

Labels whose values come from callers (the model and client a request names, the key and
owner) are bounded: the first :data:`LABEL_CAPS` values of each keep their own series,
later ones are counted under ``other``, so a flood of made-up model names cannot grow the
registry without end.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from prefixgate.loopwatch import LoopWatch
from prefixgate.record import Record

LABELS = ("channel", "entry", "model", "client")
SPEND_LABELS = ("key", "owner", "model")
LABEL_CAPS = {"model": 50, "client": 50, "key": 500, "owner": 100}
OTHER = "other"
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


class _WorkerCollector:
    """Which process answered the scrape. With ``serve --workers N`` every worker keeps its
    own registry and the kernel hands each connection to one of them, so a scrape shows
    one worker's figures; ``prefixgate_worker_info{pid}`` says whose."""

    def collect(self):
        g = GaugeMetricFamily(
            "prefixgate_worker_info", "The worker process answering this scrape.", labels=("pid",)
        )
        g.add_metric([str(os.getpid())], 1)
        yield g


class _AdmissionCollector:
    """The admission gates (``admission.py``) as they are at scrape time: the worker's
    (``scope="worker"``) and each capped channel's."""

    def __init__(self, admission) -> None:
        self.admission = admission

    def collect(self):
        a = self.admission
        gates = [("worker", "", a.worker)] + [("channel", n, g) for n, g in a.channels.items()]
        families = (
            (
                GaugeMetricFamily,
                "prefixgate_in_flight",
                "Requests admitted and not done.",
                "in_flight",
            ),
            (
                GaugeMetricFamily,
                "prefixgate_in_flight_limit",
                "The cap on requests in flight.",
                "limit",
            ),
            (GaugeMetricFamily, "prefixgate_queued", "Requests waiting for a slot.", "queued"),
            (
                CounterMetricFamily,
                "prefixgate_admission_refused",
                "Requests answered overloaded (queue full or wait ran out).",
                "refused",
            ),
            (
                CounterMetricFamily,
                "prefixgate_admission_waited",
                "Requests admitted after waiting in the queue.",
                "waited",
            ),
        )
        for family, name, doc, attr in families:
            m = family(name, doc, labels=("scope", "channel"))
            for scope, channel, gate in gates:
                m.add_metric([scope, channel], getattr(gate, attr))
            yield m
        shed = a.shed
        if shed is not None:
            yield CounterMetricFamily(
                "prefixgate_admission_shed",
                "Requests answered overloaded because the event loop ran too late.",
                value=shed.shed,
            )
            yield GaugeMetricFamily(
                "prefixgate_loop_late_seconds",
                "How late the admission's 10 Hz timer last ran (the loop's backlog).",
                value=shed.late,
            )


class LabelCap:
    """At most ``caps[label]`` distinct values per label; the values after them are
    :data:`OTHER`."""

    def __init__(self, caps: dict[str, int]) -> None:
        self.caps = caps
        self._seen: dict[str, set[str]] = {name: set() for name in caps}

    def __call__(self, label: str, value: str | None) -> str:
        if value is None:
            return "-"
        seen = self._seen[label]
        if value in seen:
            return value
        if len(seen) >= self.caps[label]:
            return OTHER
        seen.add(value)
        return value


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
        self.spend_tokens = Counter(
            "prefixgate_spend_tokens",
            "Upstream tokens per key, owner and model, by kind: fresh, cached and written"
            " input, output.",
            (*SPEND_LABELS, "kind"),
            registry=r,
        )
        self.spend_cost = Counter(
            "prefixgate_spend_cost",
            "Cost per key, owner and model, in the price table's currency.",
            SPEND_LABELS,
            registry=r,
        )
        self.spend_saved = Counter(
            "prefixgate_spend_cost_saved",
            "What cache hits saved per key, owner and model, in the price table's currency.",
            SPEND_LABELS,
            registry=r,
        )
        self.cap = LabelCap(LABEL_CAPS)
        self.retries = Counter(
            "prefixgate_failovers",
            "Attempts that failed over to another target.",
            ("entry",),
            registry=r,
        )
        self.route_source = Counter(
            "prefixgate_route_source",
            "Routing decisions by where the replicas' cache state came from (events, "
            "estimate, events+estimate).",
            ("channel", "source"),
            registry=r,
        )
        self.loop = LoopWatch(r)  # the event loop's pauses; started by the app's lifespan
        r.register(_WorkerCollector())
        self._totals: dict[tuple, list[int]] = {}
        self._children: dict[tuple, object] = {}
        if writer is not None:
            r.register(_WriterCollector(writer))

    def watch_admission(self, admission) -> None:
        self.registry.register(_AdmissionCollector(admission))

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
        cap = self.cap
        model = cap("model", rec.requested_model)
        labels = (rec.channel or "-", rec.endpoint or "-", model, cap("client", rec.client))
        child = self._child
        child(self.requests, *labels, str(rec.status)).inc()
        if rec.retries:
            child(self.retries, labels[1]).inc(rec.retries)
        if rec.route_source is not None:
            child(self.route_source, labels[0], rec.route_source).inc()
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
        if rec.prompt_tokens or rec.completion_tokens:
            self._spend(rec, (cap("key", rec.key_name), cap("owner", rec.key_owner), model))
        if rec.latency_ms is not None:
            child(self.latency, labels[0], labels[1]).observe(rec.latency_ms / 1000)
        if rec.ttft_ms is not None:
            child(self.ttft, labels[0], labels[1]).observe(rec.ttft_ms / 1000)

    def _spend(self, rec: Record, who: tuple[str, str, str]) -> None:
        child = self._child
        cached = rec.cached_tokens or 0
        written = rec.cache_creation_tokens or 0
        fresh = max(0, (rec.prompt_tokens or 0) - cached - written)
        for kind, n in (
            ("fresh", fresh),
            ("cached", cached),
            ("cache_write", written),
            ("output", rec.completion_tokens or 0),
        ):
            if n:
                child(self.spend_tokens, *who, kind).inc(n)
        if rec.cost_nano is not None:
            child(self.spend_cost, *who).inc(rec.cost_nano / 1e9)
            child(self.spend_saved, *who).inc((rec.cost_saved_nano or 0) / 1e9)

    def render(self) -> bytes:
        return generate_latest(self.registry)
