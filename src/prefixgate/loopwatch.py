"""Event-loop pauses, measured where they happen: how late a timer that should fire every
``interval`` seconds actually fires, and how long each garbage collection holds the
interpreter. Every stream a worker relays waits out such a pause at once, so its length
(not the average) is what an agent sees as a stall between two tokens; ``/metrics`` has
both as histograms (``prefixgate_loop_lag_seconds``, ``prefixgate_gc_pause_seconds``).

Opt-in (``server.loop_watch``). A pause of P seconds shows as a lag of at least P - ``interval``; the timer costs the loop
about 100 wake-ups a second, a few microseconds each.
"""

from __future__ import annotations

import asyncio
import gc
import time

from prometheus_client import CollectorRegistry, Histogram

PAUSE_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


class LateTimer:
    """A timer every ``interval`` seconds that measures how late the loop ran it and hands
    the lateness (seconds, never negative) to :meth:`_late`; started and stopped in the
    serving loop. The loop watch below and admission's load shed (``admission.LagShed``)
    are two of them."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due = 0.0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._due = self._loop.time() + self.interval
        self._handle = self._loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        loop = self._loop
        now = loop.time()
        late = now - self._due
        self._late(late if late > 0.0 else 0.0)
        self._due = now + self.interval
        self._handle = loop.call_at(self._due, self._tick)

    def _late(self, late: float) -> None:
        raise NotImplementedError


class LoopWatch(LateTimer):
    """Started and stopped by the app's lifespan, in the serving loop."""

    def __init__(self, registry: CollectorRegistry, interval: float = 0.01) -> None:
        super().__init__(interval)
        self.lag = Histogram(
            "prefixgate_loop_lag_seconds",
            "How late the event loop ran a timer: the loop's pauses.",
            buckets=PAUSE_BUCKETS,
            registry=registry,
        )
        self.gc_pause = Histogram(
            "prefixgate_gc_pause_seconds",
            "Garbage collections and how long each held the interpreter.",
            ("generation",),
            buckets=PAUSE_BUCKETS,
            registry=registry,
        )
        self._gc_children = [self.gc_pause.labels(str(g)) for g in range(3)]
        self._gc_start = 0.0
        self.longest = 0.0  # seconds: the longest lag seen

    def start(self) -> None:
        super().start()
        gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        super().stop()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _late(self, late: float) -> None:
        if late > self.longest:
            self.longest = late
        self.lag.observe(late)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._gc_start:
            self._gc_children[info.get("generation", 2)].observe(
                time.perf_counter() - self._gc_start
            )
            self._gc_start = 0.0
