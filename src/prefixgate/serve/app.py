"""The ASGI app: routes and lifecycle. Nothing protocol-specific lives here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from prefixgate.auth import refresh_keys
from prefixgate.config import Config
from prefixgate.engine import order as render_orders
from prefixgate.errors import GatewayError, HeadersTooLarge, InvalidRequest, NotFound, Unavailable
from prefixgate.gateway import Gateway
from prefixgate.pipeline import error_response
from prefixgate.protocol import anthropic as anthropic_proto
from prefixgate.protocol import openai as openai_proto
from prefixgate.reload import config_state
from prefixgate.serve.browsers import BrowserGuard
from prefixgate.serve.edge import send_refusal

log = logging.getLogger("prefixgate")


def create_app(
    config: Config, *, recorder=None, upstream=None, capture=None, token_counter=None
) -> Starlette:
    events = _engine_events(config)
    gateway = Gateway(
        config,
        upstream=upstream,
        recorder=recorder,
        capture=capture,
        token_counter=token_counter,
        events=events,
    )
    ledger = _ledger(config, gateway, events)

    async def healthz(request: Request) -> Response:
        """``ok`` for anyone; with ``?details`` (and the admin key) also the state of each
        replica's KV-event stream and what is known of each channel's chat template. Events never make the gateway unhealthy: a stale stream
        only makes routing fall back."""
        if "details" not in request.query_params:
            return JSONResponse({"status": "ok"})
        try:
            await gateway.auth.check_admin(request.headers, request.scope)
        except GatewayError as err:
            return error_response(err, openai_proto.error_bytes)
        kv = events.statuses() if events is not None else []
        rendering = render_orders.renderings(gateway.config.channels)
        details = {"kv_events": kv, "rendering": rendering, "config": config_state(gateway)}
        return JSONResponse({"status": "ok", "details": details})

    async def metrics(request: Request) -> Response:
        try:
            await gateway.auth.check_admin(request.headers, request.scope)
        except GatewayError as err:
            return error_response(err, openai_proto.error_bytes)
        return Response(
            gateway.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    holders = None
    if config.store is not None:  # the doctor's findings for key holders, kept a while
        from prefixgate.web.me import HolderFindings

        holders = HolderFindings(config.store.dsn)

    async def me(request: Request) -> Response:
        """The caller's own usage, budgets, sessions and prefix breaks (web/me.py), for
        the key they present; never another key's."""
        try:
            principal = gateway.auth.authenticate(request.headers)
            if config.store is None:
                raise NotFound("nothing is recorded here: the gateway has no store")
            from prefixgate.web.routes import me_of

            out = await me_of(gateway, config.store.dsn, principal, request, holders)
            return JSONResponse(out)
        except GatewayError as err:
            return error_response(err, openai_proto.error_bytes)

    async def openapi(request: Request) -> Response:
        from prefixgate.protocol.schemas import openapi_document

        return JSONResponse(openapi_document())

    async def root(request: Request) -> Response:
        return (
            JSONResponse({"name": "prefixgate"})
            if request.method == "GET"
            else Response(status_code=200)
        )

    async def not_found(request: Request, exc: HTTPException) -> Response:
        # Anthropic clients send anthropic-version; everyone else gets the OpenAI shape.
        err = _http_error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")
        return error_response(err, _shape_of(request.headers, request.url.path))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        if config.server.loop_watch:
            gateway.metrics.loop.start()
        if gateway.admission.shed is not None:
            gateway.admission.shed.start()
        start = getattr(gateway.recorder, "start", None)
        if start is not None:
            await start()
        await gateway.router.start()  # active health checks, shared routing state
        if events is not None:
            await events.start()  # the engines' KV events (opens in the background)
        if ledger is not None:
            await ledger.start()
        tasks = []
        learning = await render_orders.start(config.channels, gateway.upstream)
        if learning is not None:
            tasks.append(learning)
        store = config.store
        if gateway.budgets is not None and store is not None:
            await seed_budgets(gateway.budgets, store)
        if config.telemetry is not None:
            from prefixgate.telemetry import Telemetry

            gateway.telemetry = Telemetry(config.telemetry, config.channels)
        if store is not None and store.retention_days:
            tasks.append(asyncio.create_task(_prune_forever(store, store.retention_days)))
        if store is not None and config.store_keys:
            tasks.append(
                asyncio.create_task(
                    refresh_keys(gateway, store.dsn, (store.statement_timeout, store.lock_timeout))
                )
            )
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            if ledger is not None:
                await ledger.aclose()
            if events is not None:
                await events.aclose()
            await gateway.router.aclose()
            close = getattr(gateway.recorder, "close", None)
            if close is not None:
                await close()
            await gateway.upstream.aclose()
            await gateway.limiter.aclose()
            await asyncio.to_thread(gateway.fingerprints.close)  # its store connection
            await asyncio.to_thread(gateway.auth.attempts.close)  # the admin checks' store
            gateway.metrics.loop.stop()
            if gateway.admission.shed is not None:
                gateway.admission.shed.stop()
            if gateway.budgets is not None:
                await gateway.budgets.aclose()
            if gateway.telemetry is not None:
                await asyncio.to_thread(gateway.telemetry.shutdown)

    # The inference entry points: also the hot-route table below, which reaches them
    # without Starlette's router.
    inference = [
        Route("/v1/messages", gateway.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", gateway.count_tokens, methods=["POST"]),
        Route("/v1/chat/completions", gateway.chat, methods=["POST"]),
        Route("/chat/completions", gateway.chat, methods=["POST"]),
        Route("/v1/responses", gateway.responses, methods=["POST"]),
        Route("/responses", gateway.responses, methods=["POST"]),
        Route("/v1/responses/compact", gateway.compact, methods=["POST"]),
        Route("/responses/compact", gateway.compact, methods=["POST"]),
    ]
    routes = [
        *inference,
        Route("/v1/models", gateway.models, methods=["GET"]),
        Route("/v1/me", me, methods=["GET"]),
        Route("/v1/diagnostics/{id}", gateway.diagnosis, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
    if config.store is not None:
        from prefixgate.web import dashboard_routes

        routes += dashboard_routes(gateway, config.store.dsn, holders)
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: not_found})
    app.state.gateway = gateway
    app.state.events = events  # EngineEvents, or None when no channel has kv_events
    app.state.ledger = ledger  # LedgerWorker, or None without a store or events
    hot = {route.path: route.endpoint for route in inference}
    outer = HeaderLimit(HotRoutes(app, hot), config.limits.max_header_bytes)
    if config.open_access:  # no key to ask for: refuse what only a web page would send
        outer = BrowserGuard(outer, config.server.host, _shape_of)
    return AccessLog(outer) if config.server.access_log else outer


def _engine_events(config: Config):
    """The hub of the engines' KV events, when a channel has ``kv_events`` (pyzmq is only
    loaded then)."""
    if not any(ch.kv_events is not None for ch in config.channels):
        return None
    from prefixgate.events import EngineEvents

    return EngineEvents.from_config(config)


def _ledger(config: Config, gateway: Gateway, events):
    """The miss ledger's worker (ledger/), when there is a store to keep the ledgers in
    (``store.ledger``, on by default) or engine events to read; fed by each record's
    finish, its figures on ``/metrics``."""
    store = config.store if config.store is not None and config.store.ledger else None
    if store is None and events is None:
        return None
    from prefixgate.ledger.cause_metrics import LedgerCollector
    from prefixgate.ledger.worker import LedgerWorker

    factory = None
    if store is not None:
        from prefixgate.store import open_store

        dsn, statement, lock = store.dsn, store.statement_timeout, store.lock_timeout

        def factory():
            return open_store(dsn, statement_timeout=statement, lock_timeout=lock)

    worker = LedgerWorker(config, events=events, store=factory, upstream=gateway.upstream)
    gateway.ledger = worker
    gateway.metrics.registry.register(LedgerCollector(worker))
    return worker


class HotRoutes:
    """``POST`` to an inference route goes straight to its handler; everything else (other
    routes, other methods, lifespan) through Starlette. The same handlers as the routes
    above, without the router's and the middleware stack's per-request cost (measured in
    docs/performance.md). The handlers catch every exception themselves."""

    def __init__(self, app: Starlette, routes: dict) -> None:
        self.app = app
        self.routes = routes

    def __getattr__(self, name: str):
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            handler = self.routes.get(scope["path"])
            if handler is not None:
                scope["app"] = self.app
                request = Request(scope, receive, send)
                request._headers = IndexedHeaders(scope["headers"])
                response = await handler(request)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class IndexedHeaders(Headers):
    """Starlette's request headers, looked up in a dict built once instead of a scan of
    the list per lookup (a request handler asks for a dozen, most of them absent). ASGI
    servers give header names in lower case."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._list = raw
        index: dict[str, str] = {}
        for name, value in raw:
            key = name.decode("latin-1")
            if key not in index:  # the first one, as Headers.get gives
                index[key] = value.decode("latin-1")
        self._index = index

    def get(self, key: str, default=None):
        return self._index.get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return self._index[key.lower()]

    def __contains__(self, key) -> bool:
        return isinstance(key, str) and key.lower() in self._index


class HeaderLimit:
    """Refuse requests whose headers exceed a size, with 431 in the route's error shape,
    before any routing or body reading (the HTTP parser itself sets no such limit)."""

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit

    def __getattr__(self, name: str):
        return getattr(self.app, name)  # state, routes, router … of the wrapped app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            size = sum(len(k) + len(v) for k, v in scope["headers"])
            if size > self.limit:
                err = HeadersTooLarge(
                    f"request headers are {size} bytes; the limit is {self.limit} bytes"
                )
                shape = _shape_of(Headers(scope=scope), scope["path"])
                await error_response(err, shape)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _shape_of(headers, path: str):
    """The error shape of a route: Anthropic's for ``/v1/messages`` and for a client that
    sends ``anthropic-version``, OpenAI's for everyone else."""
    if "anthropic-version" in headers or path.startswith("/v1/messages"):
        return anthropic_proto.error_bytes
    return openai_proto.error_bytes


def _http_error(status: int, message: str) -> GatewayError:
    """Starlette's routing errors (404, 405) in the error tree."""
    err = NotFound(message) if status == 404 else InvalidRequest(message)
    err.status = status
    return err


def refusal_app(limit: int):
    """The answer past the connection cap (``serve/edge.py``): the route's overloaded
    answer, as admission gives it (529 in Anthropic's shape, 503 in OpenAI's), so that an
    SDK says what happened, and retries."""
    err = Unavailable(f"the gateway is at its connection limit ({limit}); retry shortly")

    async def refuse(scope, receive, send) -> None:
        if scope["type"] == "http":
            shape = _shape_of(Headers(scope=scope), scope["path"])
            status = 529 if shape is anthropic_proto.error_bytes else 503
            await send_refusal(send, shape(err), b"application/json", status)

    return refuse


class AccessLog:
    """One line per request on ``prefixgate.access`` (``server.access_log``, ``serve
    --access-log``): client, method, path (never the query string, which may carry a
    secret), status, bytes sent, seconds until the last byte, the request id when the
    answer has one; ``incomplete`` when the answer was cut."""

    log = logging.getLogger("prefixgate.access")

    def __init__(self, app) -> None:
        self.app = app

    def __getattr__(self, name: str):
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        seen = {"status": 0, "bytes": 0, "id": "", "done": False}
        if "extensions" in scope:  # a splice would write past ``send``: pumped, to be seen
            scope = {**scope, "extensions": {}}

        async def logged(message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                for name, value in message.get("headers", ()):
                    if name in (b"request-id", b"x-request-id"):
                        seen["id"] = " " + value.decode("latin-1")
            elif message["type"] == "http.response.body":
                seen["bytes"] += len(message.get("body", b""))
                seen["done"] = not message.get("more_body", False)
            await send(message)

        try:
            await self.app(scope, receive, logged)
        finally:
            client = scope.get("client") or ("-", 0)
            self.log.info(
                '%s:%s "%s %s HTTP/%s" %d %d %.3fs%s%s',
                client[0],
                client[1],
                scope["method"],
                scope["path"],
                scope["http_version"],
                seen["status"],
                seen["bytes"],
                time.perf_counter() - t0,
                seen["id"],
                "" if seen["done"] else " incomplete",
            )


async def seed_budgets(keeper, store_config) -> None:
    """What keys and owners used in the current windows, from the store into the budget
    ledger (a restart renews nobody's budget); a store that is down is said and passed."""
    from prefixgate.spend.standing import seed_counters

    try:
        await seed_counters(
            keeper, store_config.dsn, (store_config.statement_timeout, store_config.lock_timeout)
        )
    except Exception as exc:
        log.warning("budgets: cannot read what was spent from the store: %s", exc)


async def _prune_forever(store_config, days: float, every: float = 3600.0) -> None:
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


def build_app(config: Config, **kw) -> Starlette:
    """The app with its record writer and capture step, as configured."""
    recorder = kw.pop("recorder", None)
    capture = kw.pop("capture", None)
    if config.store is not None:
        from prefixgate.record.capture import Capturer
        from prefixgate.record.writer import RecordWriter

        if recorder is None:
            recorder = RecordWriter.from_config(config.store)
        if capture is None and config.store.capture_segments:
            capture = Capturer(int(config.store.change_memory_mb * 1024 * 1024))
    return create_app(config, recorder=recorder, capture=capture, **kw)
