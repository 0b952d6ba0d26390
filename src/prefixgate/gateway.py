"""The gateway: every service a request's steps use (auth, router, upstream, limiter,
recorder, capture, ledger, metrics …), built from the config in one place
(:meth:`Gateway.from_config`) and started and stopped by ``async with gateway``, in the
order of :data:`prefixgate.services.STARTS`. The routes that reach them are the server's
(``serve/app.py``); the steps of each endpoint are in :mod:`prefixgate.pipeline`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from prefixgate import services
from prefixgate.admission import Admission
from prefixgate.apis.messages.count import estimate_tokens
from prefixgate.apis.messages.request import SessionTurns
from prefixgate.auth import Authenticator
from prefixgate.config import ChannelConfig, Config, StoreConfig
from prefixgate.diagnostics.lookup import Fingerprints
from prefixgate.engine.client import EngineClient
from prefixgate.engine.order import RenderOrders
from prefixgate.events.tokens import EngineTokens
from prefixgate.live import Live
from prefixgate.logthrottle import LogThrottle
from prefixgate.metrics import GatewayMetrics
from prefixgate.pipeline.models import ModelLists
from prefixgate.ratelimit import make_limiter
from prefixgate.record import Record
from prefixgate.record.deferred import DeferredCapture
from prefixgate.reload import ReloadCollector, ReloadLog, ReloadResult, reload_gateway
from prefixgate.routing.channels import ChannelRouter
from prefixgate.spend.keeper import BudgetKeeper
from prefixgate.spend.prices import PriceTable
from prefixgate.upstream import Upstream

if TYPE_CHECKING:
    from prefixgate.events.hub import EngineEvents
    from prefixgate.store.base import Store
    from prefixgate.telemetry import Telemetry

log = logging.getLogger("prefixgate")


class NullRecorder:
    """Where records go without a store: nowhere."""

    def submit(self, record: Record) -> None:
        pass


class NullLedger:
    """The miss ledger without a store or engine events: none."""

    def feed(self, record: Record, request: dict | None, then=None, blocks: object = None) -> None:
        if then is not None:
            then(None)  # no ledger for anyone waiting for one


class Gateway:
    log = log
    services: tuple[services.Start, ...] = services.STARTS  # started in this order

    def __init__(
        self,
        config: Config,
        *,
        upstream: EngineClient,
        recorder=None,
        capture: Callable[..., None] | None = None,
        token_counter: Callable[[dict, ChannelConfig | None], int] | None = None,
        events: EngineEvents | None = None,
        ledger=None,
        render_orders: RenderOrders | None = None,
    ) -> None:
        """The services given (:meth:`from_config` builds them from the config); those
        not given do nothing (no records kept, no capture, no ledger)."""
        self.upstream = upstream
        # what each channel's chat template was learned to do (engine/order.py): the
        # gateway's own, kept across reloads
        self.render_orders = render_orders if render_orders is not None else RenderOrders()
        self.events = events  # the engines' KV events (events/hub.py), or None
        # The config and what is built from it (keys, router, prices, budgets): replaced
        # whole by a reload (reload.py); each request keeps the one it arrived on.
        self.live = Live.build(
            config, upstream=self.upstream, events=events, orders=self.render_orders
        )
        self.reloads = ReloadLog()
        self.draining: set[Live] = set()  # retired generations with requests still running
        self.key_epoch = None  # auth.KeyEpoch shared by the workers of one serve, if any
        self.recorder = recorder or NullRecorder()
        self.metrics = GatewayMetrics(recorder)
        self.ledger = ledger or NullLedger()  # the miss ledger's worker (ledger/)
        self.admission = Admission(config.server, config.channels)
        self.metrics.watch_admission(self.admission)
        self.metrics.registry.register(ReloadCollector(self))
        if events is not None:
            from prefixgate.events.stream_metrics import EventsCollector

            self.metrics.registry.register(EventsCollector(events))
        if ledger is not None:
            from prefixgate.ledger.cause_metrics import LedgerCollector

            self.metrics.registry.register(LedgerCollector(ledger))
        self.captures = DeferredCapture(
            capture, self.render_orders
        )  # the capture step's, off its clock
        # Each session's latest conversion (apis/messages/request.py), within the change
        # memory's bound (store.change_memory_mb; its default without a store).
        change_mb = (config.store or StoreConfig()).change_memory_mb
        self.turns = SessionTurns(int(change_mb * 1024 * 1024))
        # diagnostics/: the requests that asked why their cache missed, for the next ones
        self.fingerprints = Fingerprints(_store_factory(config.store))
        self.token_counter = token_counter or partial(estimate_tokens, orders=self.render_orders)
        self.model_lists = ModelLists(self.upstream)  # GET /v1/models (pipeline/models.py)
        self.limiter = make_limiter(config.rate_limits_shared)
        self.telemetry: Telemetry | None = None  # when config.telemetry, once started
        self.failures = LogThrottle(log, interval=10.0)
        self._background: set[asyncio.Task] = set()
        self._stack: contextlib.AsyncExitStack | None = None
        # Requests taken and not yet recorded (a stream's record closes as its last
        # chunk is written, so a client reading the stream can be a moment ahead).
        self.open_records = 0

    @classmethod
    def from_config(
        cls,
        config: Config,
        *,
        upstream: Upstream | None = None,
        recorder=None,
        capture: Callable[..., None] | None = None,
        token_counter: Callable[[dict, ChannelConfig | None], int] | None = None,
    ) -> Gateway:
        """Every service as the config says (those given instead: a test's fakes): the
        upstream client, the engines' KV events, the record writer and the segment capture
        of the store, the miss ledger's worker."""
        store = config.store
        if store is not None:
            if recorder is None:
                from prefixgate.record.writer import RecordWriter

                recorder = RecordWriter.from_config(store)
            if capture is None and store.capture_segments:
                from prefixgate.record.capture import Capturer

                capture = Capturer(int(store.change_memory_mb * 1024 * 1024))
        client = EngineClient(upstream or _upstream_for(config))
        events = _engine_events(config)
        orders = RenderOrders()
        return cls(
            config,
            upstream=client,
            recorder=recorder,
            capture=capture,
            token_counter=token_counter,
            events=events,
            ledger=_ledger(config, client, events, orders, recorder),
            render_orders=orders,
        )

    async def __aenter__(self) -> Gateway:
        """Start the services in the order of :attr:`services`; a start that fails stops
        those already started, and raises."""
        async with contextlib.AsyncExitStack() as stack:
            for start in self.services:
                await start(self, stack)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc) -> None:
        """Stop the services, in the reverse order of their starts."""
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    # -- the current generation (live.py) -------------------------------------------------
    @property
    def config(self) -> Config:
        return self.live.config

    @property
    def auth(self) -> Authenticator:
        return self.live.auth

    @property
    def router(self) -> ChannelRouter:
        return self.live.router

    @property
    def engine_tokens(self) -> EngineTokens:
        return self.live.engine_tokens

    @property
    def prices(self) -> PriceTable | None:
        return self.live.prices

    @property
    def budgets(self) -> BudgetKeeper | None:
        return self.live.budgets

    async def reload(self, config: Config) -> ReloadResult:
        """Serve ``config`` from now on (``reload.py``): requests in flight finish on the
        generation they started with."""
        return await reload_gateway(self, config)

    # -- generations and background work ------------------------------------------------------
    def done_with(self, live: Live) -> None:
        """A request that ran on ``live`` ended: the last one of a retired generation
        closes it."""
        live.inflight -= 1
        if live.retired and live.inflight == 0:
            self.close_generation(live)

    def retired_generations(self) -> list[Live]:
        return list(self.draining)

    def close_generation(self, live: Live) -> None:
        from prefixgate.reload import close_generation

        self.spawn(close_generation(self, live))

    def spawn(self, coro) -> asyncio.Task:
        """Run ``coro`` in the background, kept referenced until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task


def _store_factory(store: StoreConfig | None) -> Callable[[], Store] | None:
    """How a service opens the store (its own connection, with the store's timeouts)."""
    if store is None:
        return None

    def factory() -> Store:
        from prefixgate.store import open_store

        return open_store(
            store.dsn, statement_timeout=store.statement_timeout, lock_timeout=store.lock_timeout
        )

    return factory


def _upstream_for(config: Config) -> Upstream:
    """The upstream client with the connection limits of the config: in all, the worker's
    admission cap and room for model listings (so it never binds before admission does);
    a channel's own to each of its replicas, its ``max_connections`` (else its
    ``max_in_flight``), idle ones closed after its ``keepalive``."""
    upstream = Upstream(max_connections=config.server.max_in_flight + 64)
    for ch in config.channels:
        for url in ch.urls():
            upstream.limit(
                url,
                max_connections=ch.max_connections or ch.max_in_flight,
                keepalive=ch.keepalive,
                channel=ch.name,
            )
    return upstream


def _engine_events(config: Config) -> EngineEvents | None:
    """The hub of the engines' KV events, when a channel has ``kv_events`` (pyzmq is only
    loaded then)."""
    if not any(ch.kv_events is not None for ch in config.channels):
        return None
    from prefixgate.events import EngineEvents

    return EngineEvents.from_config(config)


def _ledger(
    config: Config,
    upstream: EngineClient,
    events: EngineEvents | None,
    orders: RenderOrders,
    recorder=None,
):
    """The miss ledger's worker (ledger/), when there is a store to keep the ledgers in
    (``store.ledger``, on by default) or engine events to read; fed by each record's
    finish, its figures on ``/metrics``. Its ledgers go into the record writer's batches
    (one transaction with the turn's record) when the writer is the store's own."""
    store = config.store if config.store is not None and config.store.ledger else None
    if store is None and events is None:
        return None
    from prefixgate.ledger.worker import LedgerWorker
    from prefixgate.record.writer import RecordWriter

    writer = recorder if store is not None and isinstance(recorder, RecordWriter) else None
    return LedgerWorker(
        config,
        events=events,
        store=_store_factory(store),
        upstream=upstream,
        orders=orders,
        writer=writer,
    )


__all__ = ["Gateway", "NullLedger", "NullRecorder"]
