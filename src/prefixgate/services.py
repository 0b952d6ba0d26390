"""The gateway's services as they start, in order: :data:`STARTS`. ``async with gateway``
(``gateway.py``) runs them on one :class:`contextlib.AsyncExitStack`; each starts its
service and registers its stop on the stack as it does, so the services stop in the
reverse order, and a start that fails stops those already started.

A stop that closes a generation's service (the router, the budgets, the admin checks'
store) closes the generation serving when it runs (``live.py``: a reload swaps them)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefixgate.gateway import Gateway

log = logging.getLogger("prefixgate")

Start = Callable[["Gateway", AsyncExitStack], Awaitable[None]]


async def upstream(gw: Gateway, stack: AsyncExitStack) -> None:
    """The upstream client's connections: closed last, after all that uses them."""
    stack.push_async_callback(gw.upstream.aclose)


async def stores(gw: Gateway, stack: AsyncExitStack) -> None:
    """The diagnostics' and the admin checks' store connections, and the rate limiter's
    (its shared Redis, when configured)."""
    stack.push_async_callback(asyncio.to_thread, gw.fingerprints.close)

    async def attempts() -> None:
        await asyncio.to_thread(gw.auth.attempts.close)

    stack.push_async_callback(attempts)
    stack.push_async_callback(gw.limiter.aclose)


async def telemetry(gw: Gateway, stack: AsyncExitStack) -> None:
    """The OTLP exporter (its thread starts with it), when configured; shut down after
    the ledger, whose last ledgers export their spans."""
    cfg = gw.config.telemetry
    if cfg is None:
        return
    from prefixgate.telemetry import Telemetry

    gw.telemetry = tel = Telemetry(cfg, gw.config.channels)
    stack.push_async_callback(asyncio.to_thread, tel.shutdown)


async def timers(gw: Gateway, stack: AsyncExitStack) -> None:
    """The event loop's lag watch (``server.loop_watch``) and the admission's shedding
    timer (``server.shed_loop_lag``)."""
    loop = gw.metrics.loop
    if gw.config.server.loop_watch:
        loop.start()
    stack.callback(loop.stop)
    shed = gw.admission.shed
    if shed is not None:
        shed.start()
        stack.callback(shed.stop)


async def recorder(gw: Gateway, stack: AsyncExitStack) -> None:
    """The record writer: its journal replayed, its batches to the store."""
    start = getattr(gw.recorder, "start", None)
    if start is not None:
        await start()
    close = getattr(gw.recorder, "close", None)
    if close is not None:
        stack.push_async_callback(close)


async def budgets(gw: Gateway, stack: AsyncExitStack) -> None:
    """What the budgets counted before this start, from the store."""

    async def close() -> None:
        if gw.budgets is not None:
            await gw.budgets.aclose()

    stack.push_async_callback(close)
    store = gw.config.store
    if gw.budgets is not None and store is not None:
        await seed_budgets(gw.budgets, store)


async def router(gw: Gateway, stack: AsyncExitStack) -> None:
    """Active health checks and the shared routing state."""
    await gw.router.start()

    async def close() -> None:
        await gw.router.aclose()

    stack.push_async_callback(close)


async def events(gw: Gateway, stack: AsyncExitStack) -> None:
    """The engines' KV events (their subscriptions open in the background)."""
    if gw.events is not None:
        await gw.events.start()
        stack.push_async_callback(gw.events.aclose)


async def ledger(gw: Gateway, stack: AsyncExitStack) -> None:
    """The miss ledger's worker."""
    start, close = getattr(gw.ledger, "start", None), getattr(gw.ledger, "aclose", None)
    if start is not None and close is not None:  # (none without a store or events)
        await start()
        stack.push_async_callback(close)


async def render_orders(gw: Gateway, stack: AsyncExitStack) -> None:
    """The chat templates' order, learned from the channels' engines (the first round
    waited for a moment, then again every few minutes)."""
    task = await gw.render_orders.start(gw.config.channels, gw.upstream)
    if task is not None:
        stack.callback(task.cancel)


async def retention(gw: Gateway, stack: AsyncExitStack) -> None:
    """Records older than ``store.retention_days`` pruned, hourly."""
    store = gw.config.store
    if store is not None and store.retention_days:
        task = asyncio.create_task(prune_forever(store, store.retention_days))
        stack.callback(task.cancel)


async def store_keys(gw: Gateway, stack: AsyncExitStack) -> None:
    """The store's keys read again every few seconds (``store_keys``)."""
    store = gw.config.store
    if store is not None and gw.config.store_keys:
        from prefixgate.auth import refresh_keys

        timeouts = (store.statement_timeout, store.lock_timeout)
        task = asyncio.create_task(refresh_keys(gw, store.dsn, timeouts))
        stack.callback(task.cancel)


STARTS: tuple[Start, ...] = (
    upstream,
    stores,
    telemetry,
    timers,
    recorder,
    budgets,
    router,
    events,
    ledger,
    render_orders,
    retention,
    store_keys,
)


async def seed_budgets(keeper, store_config) -> None:
    """What keys and owners used in the current windows, from the store into the budget
    counters (a restart renews nobody's budget); a store that is down is said and passed."""
    from prefixgate.spend.standing import seed_counters

    try:
        await seed_counters(
            keeper, store_config.dsn, (store_config.statement_timeout, store_config.lock_timeout)
        )
    except Exception as exc:
        log.warning("budgets: cannot read what was spent from the store: %s", exc)


async def prune_forever(store_config, days: float, every: float = 3600.0) -> None:
    """Retention: delete records older than ``days``, hourly, off the event loop. A lock
    held elsewhere fails the round (``lock_timeout``) rather than hold a thread, which
    the interpreter would wait for at exit; the delete itself may take minutes."""
    from prefixgate.store import open_store

    def prune() -> int:
        with open_store(
            store_config.dsn, statement_timeout=600.0, lock_timeout=store_config.lock_timeout
        ) as store:
            return store.prune(days * 86400.0)

    while True:
        try:
            n = await asyncio.to_thread(prune)
            if n:
                log.info("retention: pruned %d records older than %g days", n, days)
        except Exception as exc:  # the store may be down; try again next round
            log.warning("retention prune failed: %s", exc)
        await asyncio.sleep(every)


__all__ = ["STARTS", "prune_forever", "seed_budgets"]
