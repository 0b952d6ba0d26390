"""A background task's wake-up: a flag that one task waits on, for at most a while.

The record writer and the ledger worker sleep between batches until a request hands them
work or their flush interval ends. ``asyncio.Event.wait()`` under ``asyncio.timeout()``
does that in Python: the context manager's timer rescheduled, the event's waiter list, the
cancellation it turns into a timeout; about 450 bytecodes a Claude Code turn between the
two tasks (``benchmarks/pyops.py``). A :class:`Wake` is one future and, when timed, one
timer.

Used from the event loop's thread only, by one waiter at a time (each of those tasks
waits on its own).
"""

from __future__ import annotations

import asyncio


class Wake:
    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[bool] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        """Set the flag; the task waiting, if any, wakes up."""
        self._set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    def clear(self) -> None:
        self._set = False

    async def wait(self, timeout: float | None = None) -> bool:
        """Until the flag is set (True, at once if it is) or ``timeout`` seconds have
        passed (False; None: no limit). The flag stays as it is: :meth:`clear` it."""
        if self._set:
            return True
        if self._waiter is not None:
            raise RuntimeError("a Wake is waited on by one task at a time")
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _expire, waiter)
        try:
            return await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)
