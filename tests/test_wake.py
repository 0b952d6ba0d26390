"""The background tasks' wake-up: set, cleared, waited on with and without a limit."""

from __future__ import annotations

import asyncio

import pytest

from prefixgate.wake import Wake


def test_a_set_flag_is_returned_at_once_and_stays_set_until_cleared() -> None:
    async def main() -> None:
        wake = Wake()
        wake.set()
        assert await wake.wait() is True
        assert await wake.wait(0) is True
        assert wake.is_set()
        wake.clear()
        assert not wake.is_set()
        assert await wake.wait(0) is False

    asyncio.run(main())


def test_set_wakes_the_waiting_task_and_a_limit_that_passes_returns_false() -> None:
    async def main() -> None:
        wake = Wake()
        waiting = asyncio.create_task(wake.wait())
        await asyncio.sleep(0)
        assert not waiting.done()
        wake.set()
        assert await waiting is True
        wake.clear()
        assert await wake.wait(0.001) is False  # nobody set it
        # after a limit passed, the flag and the next wait work as before
        waiting = asyncio.create_task(wake.wait(60))
        await asyncio.sleep(0)
        wake.set()
        assert await waiting is True

    asyncio.run(main())


def test_a_cancelled_wait_leaves_the_wake_usable_and_one_waiter_at_a_time() -> None:
    async def main() -> None:
        wake = Wake()
        first = asyncio.create_task(wake.wait(60))
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="one task at a time"):
            await wake.wait()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        second = asyncio.create_task(wake.wait())
        await asyncio.sleep(0)
        wake.set()
        assert await second is True

    asyncio.run(main())
