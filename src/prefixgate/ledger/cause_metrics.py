"""The ledger's figures on ``/metrics``, read from the worker at scrape time (nothing is
updated per request): prompt tokens by cause, and how often each predictor of the hit
agreed exactly with the engine's reported ``cached_tokens``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from prefixgate.ledger.worker import LedgerWorker

__all__ = ["LedgerCollector"]


class LedgerCollector:
    def __init__(self, worker: LedgerWorker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        w = self.worker
        tokens = CounterMetricFamily(
            "prefixgate_ledger_tokens",
            "Prompt tokens of recorded requests by where they went (the miss ledger).",
            labels=("channel", "cause"),
        )
        predictions, agreeing = (
            CounterMetricFamily(name, doc, labels=("channel", "predictor"))
            for name, doc in (
                (
                    "prefixgate_hit_predictions",
                    "Requests whose hit a predictor (index, model) predicted, beside the "
                    "engine's figure.",
                ),
                (
                    "prefixgate_hit_predictions_agreeing",
                    "Predictions equal to the engine's reported cached_tokens.",
                ),
            )
        )
        rate = GaugeMetricFamily(
            "prefixgate_hit_prediction_agreement",
            "Share of predictions equal to the engine's cached_tokens since start.",
            labels=("channel", "predictor"),
        )
        for channel, cal in sorted(w.calibration.items()):
            for cause, n in cal.tokens.items():
                tokens.add_metric([channel, cause], n)
            for name, n, agree in (
                ("index", cal.index_requests, cal.index_agree),
                ("model", cal.model_requests, cal.model_agree),
            ):
                if n:
                    predictions.add_metric([channel, name], n)
                    agreeing.add_metric([channel, name], agree)
                    rate.add_metric([channel, name], agree / n)
        yield tokens
        yield predictions
        yield agreeing
        yield rate
        for name, value, doc in (
            ("prefixgate_ledgers_computed", w.computed, "Miss ledgers computed."),
            ("prefixgate_ledgers_dropped", w.dropped + w.lost, "Ledgers dropped (queue full)."),
            ("prefixgate_ledger_queue", len(w._queue), "Requests waiting for their ledger."),
        ):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g
