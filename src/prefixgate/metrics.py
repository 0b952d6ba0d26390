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
import time
from bisect import bisect_left

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

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


class _Sums:
    """One metric's per-request sums, by label values: a plain dict each request adds
    to (a lookup and an add, no lock: only the event loop's thread feeds it and scrapes
    it), turned into its metric family at scrape time. prometheus_client's own children
    cost a lock and a check per increment, a dozen times a request (docs/performance.md,
    "A turn decodes its new messages alone")."""

    __slots__ = ("name", "doc", "labels", "values", "created")

    def __init__(self, name: str, doc: str, labels: tuple[str, ...]):
        self.name, self.doc, self.labels = name, doc, labels
        self.values: dict[tuple, float] = {}
        self.created: dict[tuple, float] = {}

    def add(self, key: tuple, n: float) -> None:
        values = self.values
        if key in values:
            values[key] += n
        else:
            self.created[key] = time.time()  # (first: a scrape finds it with its value)
            values[key] = float(n)

    def family(self):
        c = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        created = self.created
        for key, v in list(self.values.items()):
            c.add_metric(key, v, created=created[key])
        return c


class _Latencies:
    """A histogram's buckets, sum and count by label values, as :class:`_Sums` keeps a
    counter's: the bucket found by bisection, no lock."""

    __slots__ = ("name", "doc", "labels", "bounds", "values", "created")

    def __init__(self, name: str, doc: str, labels: tuple[str, ...], bounds: tuple) -> None:
        self.name, self.doc, self.labels = name, doc, labels
        self.bounds = tuple(float(b) for b in bounds)
        self.values: dict[tuple, list[float]] = {}  # per bucket (+Inf last), then the sum
        self.created: dict[tuple, float] = {}

    def observe(self, key: tuple, seconds: float) -> None:
        v = self.values.get(key)
        if v is None:
            self.created[key] = time.time()
            v = self.values[key] = [0.0] * (len(self.bounds) + 2)
        v[bisect_left(self.bounds, seconds)] += 1
        v[-1] += seconds

    def family(self):
        h = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        for key, v in list(self.values.items()):
            buckets, total = [], 0.0
            for le, n in zip(les, v, strict=False):
                total += n
                buckets.append((le, total))
            h.add_metric(key, buckets, v[-1])
            h.samples.append(
                Sample(
                    self.name + "_created",
                    dict(zip(self.labels, key, strict=True)),
                    self.created[key],
                )
            )
        return h


class _HitRate:
    """The token-weighted prefix-cache hit rate by label values, derived at scrape time
    from the sums of prompt and cached tokens."""

    def __init__(self, prompt: _Sums, cached: _Sums) -> None:
        self.prompt, self.cached = prompt, cached

    def family(self):
        g = GaugeMetricFamily(
            "prefixgate_prefix_hit_rate",
            "Token-weighted prefix-cache hit rate since start.",
            labels=self.prompt.labels,
        )
        cached = self.cached.values
        for key, prompt in list(self.prompt.values.items()):
            if prompt:
                g.add_metric(key, cached.get(key, 0.0) / prompt)
        return g


class _RequestCollector:
    """The per-request metrics (:meth:`GatewayMetrics.observe`), summed in plain dicts and
    turned into metric families at scrape time."""

    def __init__(self, metrics: list) -> None:
        self.metrics = metrics

    def collect(self):
        for m in self.metrics:
            yield m.family()


class GatewayMetrics:
    def __init__(self, writer=None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = _Sums("prefixgate_requests", "Requests by outcome.", (*LABELS, "status"))
        self.prompt = _Sums(
            "prefixgate_prompt_tokens", "Upstream prompt tokens (cached included).", LABELS
        )
        self.cached = _Sums("prefixgate_cached_tokens", "Upstream cached prompt tokens.", LABELS)
        self.completion = _Sums(
            "prefixgate_completion_tokens", "Upstream completion tokens.", LABELS
        )
        self.hit_rate = _HitRate(self.prompt, self.cached)
        self.latency = _Latencies(
            "prefixgate_request_seconds",
            "End-to-end latency.",
            ("channel", "entry"),
            _LATENCY_BUCKETS,
        )
        self.ttft = _Latencies(
            "prefixgate_ttft_seconds",
            "Time to first content byte.",
            ("channel", "entry"),
            _LATENCY_BUCKETS,
        )
        self.upstream_errors = _Sums(
            "prefixgate_upstream_errors",
            "Failed attempts and failed requests by error type.",
            ("channel", "error"),
        )
        self.spend_tokens = _Sums(
            "prefixgate_spend_tokens",
            "Upstream tokens per key, owner and model, by kind: fresh, cached and written"
            " input, output.",
            (*SPEND_LABELS, "kind"),
        )
        self.spend_cost = _Sums(
            "prefixgate_spend_cost",
            "Cost per key, owner and model, in the price table's currency.",
            SPEND_LABELS,
        )
        self.spend_saved = _Sums(
            "prefixgate_spend_cost_saved",
            "What cache hits saved per key, owner and model, in the price table's currency.",
            SPEND_LABELS,
        )
        self.cap = LabelCap(LABEL_CAPS)
        self.retries = _Sums(
            "prefixgate_failovers", "Attempts that failed over to another target.", ("entry",)
        )
        self.route_source = _Sums(
            "prefixgate_route_source",
            "Routing decisions by where the replicas' cache state came from (events, "
            "estimate, events+estimate).",
            ("channel", "source"),
        )
        r.register(
            _RequestCollector(
                [
                    self.requests,
                    self.prompt,
                    self.cached,
                    self.completion,
                    self.hit_rate,
                    self.latency,
                    self.ttft,
                    self.upstream_errors,
                    self.spend_tokens,
                    self.spend_cost,
                    self.spend_saved,
                    self.retries,
                    self.route_source,
                ]
            )
        )
        self.loop = LoopWatch(r)  # the event loop's pauses; started by the app's lifespan
        r.register(_WorkerCollector())
        if writer is not None:
            r.register(_WriterCollector(writer))

    def watch_admission(self, admission) -> None:
        self.registry.register(_AdmissionCollector(admission))

    def observe(self, rec: Record) -> None:
        cap = self.cap
        model = cap("model", rec.requested_model)
        labels = (rec.channel or "-", rec.endpoint or "-", model, cap("client", rec.client))
        self.requests.add((*labels, str(rec.status)), 1)
        if rec.retries:
            self.retries.add((labels[1],), rec.retries)
        if rec.route_source is not None:
            self.route_source.add((labels[0], rec.route_source), 1)
        if rec.error_type and rec.status >= 500:
            self.upstream_errors.add((labels[0], rec.error_type), 1)
        if rec.prompt_tokens:
            cached = rec.cached_tokens or 0
            self.prompt.add(labels, rec.prompt_tokens)
            self.cached.add(labels, cached)
        if rec.completion_tokens:
            self.completion.add(labels, rec.completion_tokens)
        if rec.prompt_tokens or rec.completion_tokens:
            self._spend(rec, (cap("key", rec.key_name), cap("owner", rec.key_owner), model))
        if rec.latency_ms is not None or rec.ttft_ms is not None:
            where = labels[:2]
            if rec.latency_ms is not None:
                self.latency.observe(where, rec.latency_ms / 1000)
            if rec.ttft_ms is not None:
                self.ttft.observe(where, rec.ttft_ms / 1000)

    def _spend(self, rec: Record, who: tuple[str, str, str]) -> None:
        cached = rec.cached_tokens or 0
        written = rec.cache_creation_tokens or 0
        fresh = max(0, (rec.prompt_tokens or 0) - cached - written)
        tokens = self.spend_tokens
        if fresh:
            tokens.add((*who, "fresh"), fresh)
        if cached:
            tokens.add((*who, "cached"), cached)
        if written:
            tokens.add((*who, "cache_write"), written)
        if rec.completion_tokens:
            tokens.add((*who, "output"), rec.completion_tokens)
        if rec.cost_nano is not None:
            self.spend_cost.add(who, rec.cost_nano / 1e9)
            self.spend_saved.add(who, (rec.cost_saved_nano or 0) / 1e9)

    def render(self) -> bytes:
        return generate_latest(self.registry)
