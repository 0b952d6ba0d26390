"""Busy polling: after network activity, the event loop keeps polling its sockets, without
sleeping, for a short window (``server.busy_poll_us``), so that the packet that usually
follows (the upstream's answer to a request just sent, the client's next request after an
answer) is read when it lands instead of after the idle core has been woken up again.

Why: on an idle core, each wake-up costs tens of microseconds (more on a virtual machine,
where the hypervisor has to schedule the vCPU again), and a proxied request takes at least
two of them. Measured on the project's 2-core VM (docs/performance.md): a minimal
asyncio proxy adds 0.31 ms to a small request without busy polling and 0.13 ms with it.

How: any socket event ``touch()``-es the poller; while the window since the last touch is
open, a callback re-schedules itself with ``call_soon``, which makes the loop poll with a
zero timeout instead of blocking. A busy loop pays nothing more (the callback runs once
per loop turn), an idle one stops polling when the window closes, and a budget caps the
time spent polling at ``share`` of each second of wall time, so a steady trickle of
events (a few slow streams) cannot keep a core spinning.

Off by default (``busy_poll_us: 0``): it buys a tenth of a millisecond a request at low
load and costs CPU while streams trickle (``benchmarks/busypoll.py`` measures both in one
run; docs/performance.md has the figures). An opt-in for a latency-bound deployment with
a core to spare.

Who owns it: the gateway's HTTP server (``serve/httpserver.py``) makes one poller for its
loop while it serves, and touches it from its connections; it is :data:`ACTIVE` in the
server's context, where the upstream client's connections (``upstream/http1.py``), opened
from the requests it serves, find it with :func:`current`.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from time import perf_counter

# Between two polling turns of an otherwise idle loop, a few microseconds pass; a longer
# gap was the loop doing work, which is not counted against the budget.
_IDLE_TURN = 50e-6


class BusyPoll:
    __slots__ = ("loop", "window", "share", "last", "spinning", "turn", "spent", "second")

    def __init__(self, loop: asyncio.AbstractEventLoop, window: float, share: float) -> None:
        self.loop, self.window, self.share = loop, window, share
        self.last = 0.0  # the last activity
        self.spinning = False
        self.turn = 0.0  # the last polling turn
        self.spent = 0.0  # seconds spent polling in the current second
        self.second = 0.0  # when the current second began

    def touch(self) -> None:
        now = self.last = perf_counter()
        if not self.spinning:
            if now - self.second >= 1.0:
                self.second, self.spent = now, 0.0
            if self.spent < self.share:
                self.spinning = True
                self.turn = now
                self.loop.call_soon(self._spin)

    def _spin(self) -> None:
        now = perf_counter()
        gap = now - self.turn
        if gap < _IDLE_TURN:
            self.spent += gap
        self.turn = now
        if now - self.last < self.window and self.spent < self.share:
            self.loop.call_soon(self._spin)
        else:
            self.spinning = False


def poller_for(
    loop: asyncio.AbstractEventLoop, window_us: float, share: float = 0.5
) -> BusyPoll | None:
    """A poller that busy-polls ``loop`` for ``window_us`` microseconds after each socket
    event, for at most ``share`` of each second; None (off) when ``window_us <= 0``."""
    if window_us <= 0 or share <= 0:
        return None
    return BusyPoll(loop, window_us / 1e6, share)


# The poller of the server whose context this is (set by the server while it serves).
ACTIVE: ContextVar[BusyPoll | None] = ContextVar("prefixgate_busypoll", default=None)


def current() -> BusyPoll | None:
    """The poller of the server serving this context, if it busy-polls."""
    return ACTIVE.get()
