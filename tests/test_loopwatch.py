"""The event loop's pauses and the collector's, as /metrics shows them."""

from __future__ import annotations

import asyncio
import gc
import time

import httpx
from prometheus_client import CollectorRegistry

from prefixgate.loopwatch import LoopWatch


def _count(registry: CollectorRegistry, name: str, labels: dict | None = None) -> float:
    return registry.get_sample_value(name, labels or {}) or 0.0


def test_a_blocked_loop_shows_as_lag_and_a_collection_as_a_gc_pause() -> None:
    registry = CollectorRegistry()
    watch = LoopWatch(registry)

    async def main() -> None:
        watch.start()
        try:
            await asyncio.sleep(0.05)
            time.sleep(0.08)  # the loop held: the next tick is late by most of this
            await asyncio.sleep(0.05)
            gc.collect()
        finally:
            watch.stop()

    asyncio.run(main())
    assert watch.longest >= 0.07
    over_50ms = _count(registry, "prefixgate_loop_lag_seconds_count") - _count(
        registry, "prefixgate_loop_lag_seconds_bucket", {"le": "0.05"}
    )
    assert over_50ms >= 1
    assert _count(registry, "prefixgate_gc_pause_seconds_count", {"generation": "2"}) >= 1
    # Stopped: no callback left behind in the collector.
    assert watch._on_gc not in gc.callbacks


def test_metrics_of_a_running_gateway_hold_the_loop_lag(gateway) -> None:
    gw = gateway(server={"loop_watch": True})
    deadline = time.monotonic() + 30
    while True:  # the watch ticks every 10 ms from the start
        text = httpx.get(gw.url + "/metrics").text
        line = next(
            (ln for ln in text.splitlines() if ln.startswith("prefixgate_loop_lag_seconds_count")),
            "",
        )
        if line and float(line.split()[-1]) > 0:
            break
        assert time.monotonic() < deadline, "no loop lag observed"
        time.sleep(0.05)
    assert "prefixgate_gc_pause_seconds_bucket" in text or "prefixgate_gc_pause_seconds" in text
