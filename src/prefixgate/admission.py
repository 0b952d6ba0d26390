"""Admission: how many requests a worker (and each channel) carries at once, and what
happens past that.

Why: past the CPU a worker has, every stream it relays slows down together, its accept
queue overflows and clients are reset without an answer. A cap on requests in flight
keeps the admitted ones fast; a short, bounded queue absorbs a burst; past the queue (or
its deadline) the client gets its protocol's own overloaded answer with ``retry-after``
(Anthropic 529 ``overloaded_error``, OpenAI 503), which SDKs retry, before any upstream
work, and the request is recorded like any other.

A :class:`Gate` is one such cap: ``server.max_in_flight`` for the worker,
``max_in_flight`` of a channel for the requests sent to it. A slot freed while requests
wait is handed to the oldest of them directly, so a waiter is never overtaken by a
newcomer. No I/O here; everything runs on the serving event loop.

A count is a proxy for the CPU a worker has, and the right count depends on the machine
and the traffic. :class:`LagShed` watches the CPU itself, through the event loop: a timer
that should run every ``interval`` seconds runs late when the loop has more to do than it
can (every open stream's next chunk waits as long); once it runs more than
``server.shed_loop_lag`` seconds late twice in a row (a backlog, not a single pause such
as the process being descheduled once), new requests are refused as overloaded (the
streams already admitted keep their pace), until it runs under half of that again.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque

from prefixgate.errors import AtCapacity
from prefixgate.loopwatch import LateTimer


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class Gate:
    """At most ``limit`` holders at once; at most ``max_queued`` waiting, each for at most
    ``timeout`` seconds."""

    __slots__ = (
        "name",
        "limit",
        "max_queued",
        "timeout",
        "in_flight",
        "queued",
        "refused",
        "waited",
        "hold",
        "_waiters",
    )

    def __init__(self, name: str, limit: int, max_queued: int, timeout: float) -> None:
        self.name = name
        self.limit = limit
        self.max_queued = max_queued
        self.timeout = timeout
        self.in_flight = 0
        self.queued = 0
        self.refused = 0  # answered overloaded, since start
        self.waited = 0  # admitted after waiting in the queue, since start
        self.hold = 10.0  # seconds a slot is held, a moving average (for retry-after)
        self._waiters: deque[asyncio.Future] = deque()

    def try_take(self) -> bool:
        """A slot now, if one is free and nobody waits for one."""
        if self.in_flight < self.limit and not self.queued:
            self.in_flight += 1
            return True
        return False

    async def take(self) -> None:
        """A slot: now, or after waiting in the queue; :class:`AtCapacity` when the queue
        is full or the wait ran out."""
        if self.try_take():
            return
        if self.queued >= self.max_queued or self.timeout <= 0:
            raise self._refuse("the queue is full")
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiters.append(waiter)
        self.queued += 1
        timer = loop.call_later(self.timeout, _expire, waiter)
        try:
            await waiter
        except TimeoutError:
            self._forget(waiter)
            raise self._refuse(f"no slot within {self.timeout:g} s") from None
        except asyncio.CancelledError:
            # The client left. A slot handed over just before is passed on.
            if not waiter.done() or waiter.cancelled() or waiter.exception() is not None:
                self._forget(waiter)
            else:
                self.give()
            raise
        finally:
            timer.cancel()
            self.queued -= 1
        self.waited += 1

    def _forget(self, waiter: asyncio.Future) -> None:
        """A waiter that gave up leaves the queue (a later ``give`` may have dropped it)."""
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)

    def give(self, held: float | None = None) -> None:
        """Give a slot back (``held``: for how many seconds it was held): to the oldest
        waiter if any, else to the pool."""
        if held is not None:
            self.hold += (held - self.hold) * 0.05
        waiters = self._waiters
        while waiters:
            w = waiters.popleft()
            if not w.done():
                w.set_result(None)  # the slot changes hands: in_flight stays
                return
        self.in_flight -= 1

    def retry_after(self) -> int:
        """Seconds after which a retry may find a slot: the time for the queue to drain at
        the rate slots are freed (the limit over the average hold), at least 1, at most 60."""
        rate = self.limit / max(self.hold, 0.001)
        return max(1, min(60, math.ceil((self.queued + 1) / rate)))

    def _refuse(self, why: str) -> AtCapacity:
        self.refused += 1
        return AtCapacity(
            f"{self.name} is at capacity ({self.limit} requests in flight; {why}); retry shortly",
            retry_after=self.retry_after(),
        )

    def snapshot(self) -> dict:
        return {
            "limit": self.limit,
            "in_flight": self.in_flight,
            "queued": self.queued,
            "max_queued": self.max_queued,
            "refused": self.refused,
            "waited": self.waited,
        }


class LagShed(LateTimer):
    """Whether the event loop runs too late to take new requests (see the module doc): a
    timer every ``interval`` seconds, started and stopped by the app's lifespan."""

    def __init__(self, threshold: float, interval: float = 0.1) -> None:
        super().__init__(interval)
        self.threshold = threshold
        self.late = 0.0  # how late the last tick ran, seconds
        self.active = False
        self.shed = 0  # requests refused for it, since start

    def stop(self) -> None:
        super().stop()
        self.active = False

    def _late(self, late: float) -> None:
        last, self.late = self.late, late
        if self.active:
            self.active = late > self.threshold / 2
        else:  # two late ticks in a row: a backlog, not one pause (the process descheduled)
            self.active = min(last, late) > self.threshold

    def refuse(self) -> AtCapacity:
        self.shed += 1
        return AtCapacity(
            f"this gateway worker is overloaded (its event loop runs {self.late * 1000:.0f} ms "
            "late); retry shortly",
            retry_after=max(1, math.ceil(self.late * 2)),
        )


class Admission:
    """The worker's gate and one per channel with a ``max_in_flight`` of its own; the
    loop-lag shed when ``server.shed_loop_lag`` is set."""

    def __init__(self, server, channels) -> None:
        self.worker = Gate(
            "this gateway worker", server.max_in_flight, server.max_queued, server.queue_timeout
        )
        self.shed = LagShed(server.shed_loop_lag) if server.shed_loop_lag else None
        self._server = server
        self.channels: dict[str, Gate] = {}
        self.reconfigure(channels)

    def reconfigure(self, channels) -> None:
        """The channels' gates for a (reloaded) list of channels: a channel whose cap is
        unchanged keeps its gate and what it holds; a new or changed cap gets a new gate
        (requests holding the old one give it back there)."""
        server, gates = self._server, {}
        for ch in channels:
            if ch.max_in_flight is None:
                continue
            gate = self.channels.get(ch.name)
            if gate is None or gate.limit != ch.max_in_flight:
                gate = Gate(
                    f"channel {ch.name}", ch.max_in_flight, server.max_queued, server.queue_timeout
                )
            gates[ch.name] = gate
        self.channels = gates

    def snapshot(self) -> dict:
        worker = self.worker.snapshot()
        if self.shed is not None:
            worker["shed"] = self.shed.shed
            worker["loop_late_ms"] = round(self.shed.late * 1000, 1)
            worker["shedding"] = self.shed.active
        return {
            "worker": worker,
            "channels": {name: g.snapshot() for name, g in self.channels.items()},
        }
