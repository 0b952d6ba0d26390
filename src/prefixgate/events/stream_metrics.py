"""The engines' event streams on ``/metrics``: ``prefixgate_kv_events_*``, per channel and
replica, read from :meth:`~.hub.EngineEvents.statuses` at scrape time (nothing is counted
twice: the subscribers' own counters are the source).

Gauges: ``connected`` (0/1: a publisher's handshake done), ``publishers``,
``connection_since_timestamp_seconds`` (when ``connected`` took its value), ``stale``,
``complete`` (0/1), ``last_seq``, ``seconds_since_last_batch``, ``blocks`` (per ``medium``,
the index's resident entries). Counters (``_total``): publisher connects, handshake
failures, batches, events, duplicates, gaps, replays, replay failures, replayed and lost
batches, restarts, malformed messages and events, unknown events, and the index's
stored, removed, dropped, orphan and size-mismatch blocks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from .hub import EngineEvents

__all__ = ["EventsCollector"]

_LABELS = ["channel", "replica"]
_GAUGES = (
    ("connected", "1 when the replica's event publisher is connected (handshake done)."),
    ("publishers", "Event publishers connected now."),
    ("connection_since", "Unix time when the connected state took its current value."),
    ("stale", "1 when the replica's events are not trusted (routing falls back)."),
    ("complete", "1 when every batch since the publisher's first was applied."),
    ("last_seq", "Sequence number of the last batch applied."),
    ("seconds_since_last_batch", "Seconds since the last batch arrived."),
)
_NAMES = {"connection_since": "connection_since_timestamp_seconds"}  # row key -> metric
_COUNTERS = (
    ("connects", "Publisher connections (handshakes) since the start."),
    ("handshake_failures", "Connections closed before their handshake completed."),
    ("batches", "Event batches applied."),
    ("events", "Events applied."),
    ("duplicates", "Batches seen twice (the live stream after a replay)."),
    ("gaps", "Gaps in the sequence numbers."),
    ("replays", "Replays asked of the engine."),
    ("replay_failures", "Replays that failed."),
    ("replayed_batches", "Batches a replay brought."),
    ("lost_batches", "Batches no replay could bring back."),
    ("restarts", "Publisher restarts (its sequence went back)."),
    ("malformed", "Messages or payloads that did not decode."),
    ("malformed_events", "Events that did not decode."),
    ("unknown_events", "Events of an unknown type."),
)
_INDEX = (
    ("stored_blocks", "Blocks the index stored."),
    ("removed_blocks", "Blocks the index removed."),
    ("dropped", "Index entries pushed out by its memory bound."),
    ("orphan_blocks", "Blocks stored after a parent the index never saw."),
    ("size_mismatch_blocks", "Blocks of another block size than the channel's."),
)


class EventsCollector:
    """A Prometheus collector over the hub's statuses."""

    def __init__(self, events: EngineEvents) -> None:
        self.events = events

    def collect(self) -> Iterator[Metric]:
        rows = self.events.statuses()
        p = "prefixgate_kv_events_"
        gauges = {
            n: GaugeMetricFamily(p + _NAMES.get(n, n), doc, labels=_LABELS) for n, doc in _GAUGES
        }
        counters = {n: CounterMetricFamily(p + n, doc, labels=_LABELS) for n, doc in _COUNTERS}
        index = {n: CounterMetricFamily(p + "index_" + n, doc, labels=_LABELS) for n, doc in _INDEX}
        blocks = GaugeMetricFamily(
            p + "blocks", "Blocks the index holds.", labels=[*_LABELS, "medium"]
        )
        for row in rows:
            labels = [row["channel"], row["replica"]]
            for name, g in gauges.items():
                value = row[name]
                if value is not None:
                    g.add_metric(labels, float(value))
            for name, c in counters.items():
                c.add_metric(labels, row[name])
            for name, c in index.items():
                c.add_metric(labels, row["index"].get(name, 0))
            for medium, n in row["blocks"].items():
                blocks.add_metric([*labels, medium], n)
        yield from gauges.values()
        yield from counters.values()
        yield from index.values()
        yield blocks
