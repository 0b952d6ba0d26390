"""The gateway: the services a request's steps use (auth, router, upstream, limiter,
recorder, metrics, capture), the inference entry points that run an endpoint's steps
(the order is in :mod:`prefixgate.pipeline`), and the two small routes that need no
upstream answer relayed (``count_tokens``, ``models``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from prefixgate import pipeline
from prefixgate.admission import Admission
from prefixgate.apis.messages.request import ConvertOptions, SessionTurns, anthropic_to_openai
from prefixgate.auth import Authenticator, Principal
from prefixgate.config import ChannelConfig, Config, StoreConfig
from prefixgate.diagnostics.lookup import Fingerprints
from prefixgate.engine.order import render_order
from prefixgate.errors import GatewayError, UpstreamError
from prefixgate.events.tokens import EngineTokens
from prefixgate.live import Live
from prefixgate.logthrottle import LogThrottle
from prefixgate.metrics import GatewayMetrics
from prefixgate.protocol import anthropic as anthropic_proto
from prefixgate.protocol import openai as openai_proto
from prefixgate.ratelimit import make_limiter
from prefixgate.record import Record
from prefixgate.reload import ReloadCollector, ReloadLog, ReloadResult, reload_gateway
from prefixgate.routing.channels import ChannelRouter, Target
from prefixgate.spend.keeper import BudgetKeeper
from prefixgate.spend.prices import PriceTable
from prefixgate.upstream import Upstream
from prefixgate.upstream.channel import anthropic_headers, anthropic_url, bearer

if TYPE_CHECKING:
    from prefixgate.events.hub import EngineEvents
    from prefixgate.store.base import Store

log = logging.getLogger("prefixgate")


class _NullRecorder:
    def submit(self, record: Record) -> None:
        pass


class _NullLedger:
    def feed(self, record: Record, request: dict | None, then=None, blocks: object = None) -> None:
        if then is not None:
            then(None)  # no ledger for anyone waiting for one


class Gateway:
    log = log

    def __init__(
        self,
        config: Config,
        *,
        upstream: Upstream | None = None,
        recorder=None,
        capture: Callable[..., None] | None = None,
        token_counter: Callable[[dict, ChannelConfig | None], int] | None = None,
        events: EngineEvents | None = None,
    ) -> None:
        self.upstream = upstream or _upstream_for(config)
        self.events = events  # the engines' KV events (events/hub.py), or None
        # The config and what is built from it (keys, router, prices, budgets): replaced
        # whole by a reload (reload.py); each request keeps the one it arrived on.
        self.live = Live.build(config, upstream=self.upstream, events=events)
        self.reloads = ReloadLog()
        self.draining: set[Live] = set()  # retired generations with requests still running
        self.key_epoch = None  # auth.KeyEpoch shared by the workers of one serve, if any
        self.recorder = recorder or _NullRecorder()
        self.ledger = _NullLedger()  # the miss ledger (ledger/), set by the app when on
        self.metrics = GatewayMetrics(recorder)
        self.admission = Admission(config.server, config.channels)
        self.metrics.watch_admission(self.admission)
        self.metrics.registry.register(ReloadCollector(self))
        if events is not None:
            from prefixgate.events.metrics import EventsCollector

            self.metrics.registry.register(EventsCollector(events))
        self.capture = capture
        # Each session's latest conversion (apis/messages/request.py), within the change
        # memory's bound (store.change_memory_mb; its default without a store).
        change_mb = (config.store or StoreConfig()).change_memory_mb
        self.turns = SessionTurns(int(change_mb * 1024 * 1024))
        # diagnostics/: the requests that asked why their cache missed, for the next ones
        self.fingerprints = Fingerprints(_store_factory(config))
        self._own_capture: Callable[..., None] | None = None
        self.token_counter = token_counter or _estimate_tokens
        self.limiter = make_limiter(config.rate_limits_shared)
        self.telemetry = None  # telemetry.Telemetry when config.telemetry (started by the app)
        self.failures = LogThrottle(log, interval=10.0)
        self._captures: dict[str, tuple] = {}  # request id -> pending capture arguments
        self._model_lists: dict[str, tuple[float, list[str]]] = {}  # channel -> (until, ids)
        self._background: set[asyncio.Task] = set()
        # Requests taken and not yet recorded (a stream's record closes as its last
        # chunk is written, so a client reading the stream can be a moment ahead).
        self.open_records = 0

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

    # -- entry points ------------------------------------------------------------------
    async def messages(self, request: Request) -> Response:
        return await pipeline.run(pipeline.Exchange(self, request, pipeline.MESSAGES))

    async def chat(self, request: Request) -> Response:
        return await pipeline.run(pipeline.Exchange(self, request, pipeline.CHAT))

    async def responses(self, request: Request) -> Response:
        return await pipeline.run(pipeline.Exchange(self, request, pipeline.RESPONSES))

    async def compact(self, request: Request) -> Response:
        return await pipeline.run(pipeline.Exchange(self, request, pipeline.COMPACT))

    async def diagnosis(self, request: Request) -> Response:
        """``GET /v1/diagnostics/{id}``: an earlier answer's diagnosis and miss ledger."""
        from prefixgate.diagnostics.route import diagnosis

        return await diagnosis(self, request)

    async def count_tokens(self, request: Request) -> Response:
        """The prompt's tokens (``pipeline/count.py``): authenticated, limited, admitted and
        budgeted as inference is, and recorded; nothing is sent upstream."""
        return await pipeline.run(pipeline.Exchange(self, request, pipeline.COUNT_TOKENS))

    async def models(self, request: Request) -> Response:
        anthropic = "anthropic-version" in request.headers
        try:
            principal = self.auth.authenticate(request.headers)
        except GatewayError as err:
            proto = anthropic_proto if anthropic else openai_proto
            return pipeline.error_response(err, proto.error_bytes)
        names = dict.fromkeys(self.router.models())
        for ch in self.config.channels:
            if not ch.models:  # serves any model: what its upstream says it has
                names.update(dict.fromkeys(await self._upstream_models(ch, request.headers)))
        allowed = [m for m in names if principal.allows(m)]
        if anthropic:
            return JSONResponse(anthropic_proto.model_list(allowed))
        return JSONResponse(openai_proto.model_list(allowed))

    async def _upstream_models(self, ch: ChannelConfig, incoming) -> list[str]:
        """The model ids a channel that accepts any model lists upstream (``GET …/models``),
        kept for a minute (ten seconds after a failure, which lists none)."""
        now = time.monotonic()
        cached = self._model_lists.get(ch.name)
        if cached is not None and cached[0] > now:
            return cached[1]
        ids: list[str] = []
        ttl = 10.0
        urls = [u for u in ch.urls() if self.router.healthy(u)] or list(ch.urls())
        if ch.kind == "openai":
            url, headers = urls[0] + "/models", bearer(ch)
        else:
            url = anthropic_url(urls[0]).removesuffix("/messages") + "/models"
            headers = anthropic_headers(ch, incoming)
        try:
            doc = await self.upstream.get_json(
                url, timeouts=ch.timeouts, extra_headers=headers, tls=ch.tls
            )
            data = doc.get("data") if isinstance(doc, dict) else None
            if isinstance(data, list):
                ids = [
                    m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)
                ]
                ttl = 60.0
        except GatewayError as err:
            log.info("channel %s: no model list from upstream (%s)", ch.name, err.message)
        self._model_lists[ch.name] = (now + ttl, ids)
        return ids

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

    # -- services the steps use ------------------------------------------------------------
    def failed_attempt(self, target: Target, err: UpstreamError, content: bytes = b"") -> None:
        """A retryable failure of one target: its health hears of it, the log says so
        (once per interval per replica, with the count of the others). An upstream's own
        internal error (500 …, not 502-504) may be the request's doing: it ejects the replica
        only when a second request's content failed there too (``report_failure``)."""
        status = err.upstream_status
        own = status is not None and status >= 500 and status not in (502, 503, 504)
        self.router.report_failure(target, content if own else None)
        self.failures.warning(
            (target.name, target.base_url),
            "channel %s (%s) failed: %s",
            target.name,
            target.base_url,
            err.message,
        )

    def limits_done(self, principal: Principal, rec: Record) -> None:
        """Give back the rate limiter's slot and count the request's tokens, off the
        request path."""
        tokens = (rec.prompt_tokens or 0) + (rec.completion_tokens or 0)
        self.spawn(self.limiter.done(principal.name, principal.limits, tokens))

    @property
    def capture_pending(self) -> bool:
        return bool(self._captures)

    def capture_soon(self, rec: Record, *args) -> None:
        """Segment capture hashes the whole prompt (about 1 ms for Claude Code's 50 KB
        request): it runs on the event loop's next turn, when the request is on its way
        upstream and the gateway waits for the first byte, not before sending it. The
        record's finish runs it first if it is still pending; a retry replaces it."""
        pending = rec.request_id in self._captures
        self._captures[rec.request_id] = (rec, *args)
        if not pending:
            asyncio.get_running_loop().call_soon(self.capture_now, rec.request_id)

    def diagnostics_capture(self, rec: Record, *args) -> None:
        """Segments for a request that asked for diagnostics when no capture is
        configured (no store): hashes only, kept with the worker's fingerprints."""
        if self._own_capture is None:
            from prefixgate.record.capture import Capturer

            self._own_capture = Capturer(change_budget=0)
        try:
            self._own_capture(rec, *args)
        except Exception:  # never break the request path: the answer is "unavailable"
            log.exception("segment capture failed (request %s)", rec.request_id)

    def capture_now(self, request_id: str) -> None:
        args = self._captures.pop(request_id, None)
        if args is None or self.capture is None:
            return
        try:
            self.capture(*args)
        except Exception:  # the capture must never break the request path
            log.exception("segment capture failed (request %s)", request_id)


def _store_factory(config: Config) -> Callable[[], Store] | None:
    """How the diagnostics open the store to find another worker's requests."""
    store = config.store
    if store is None:
        return None

    def factory() -> Store:
        from prefixgate.store import open_store

        return open_store(
            store.dsn, statement_timeout=store.statement_timeout, lock_timeout=store.lock_timeout
        )

    return factory


def _estimate_tokens(body: dict, channel: ChannelConfig | None) -> int:
    """The prompt's tokens as the cache model renders it for the channel (the approximate
    tokenizer: about 4 characters a token)."""
    from prefixgate.cache import ApproxTokenizer, ChatRenderer

    order = render_order(channel) if channel is not None else "tools_first"
    upstream = anthropic_to_openai({"max_tokens": 1, **body}, ConvertOptions(upstream_model=""))
    text = ChatRenderer(order=order).render(upstream["messages"], upstream.get("tools"))
    return max(1, ApproxTokenizer().count(text))


__all__ = ["Gateway"]


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
