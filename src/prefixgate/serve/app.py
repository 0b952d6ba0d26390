"""The ASGI app: routes and lifecycle. Nothing protocol-specific lives here."""

from __future__ import annotations

import contextlib
import logging
import time
from itertools import chain
from operator import itemgetter, methodcaller

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from prefixgate import pipeline
from prefixgate.apis.chat import endpoint as chat
from prefixgate.apis.messages import endpoint as messages
from prefixgate.apis.responses import endpoint as responses
from prefixgate.config import Config
from prefixgate.diagnostics.route import diagnosis
from prefixgate.errors import GatewayError, HeadersTooLarge, InvalidRequest, NotFound, Unavailable
from prefixgate.gateway import Gateway, NullLedger
from prefixgate.pipeline import error_response
from prefixgate.pipeline.models import models
from prefixgate.protocol import anthropic as anthropic_proto
from prefixgate.protocol import openai as openai_proto
from prefixgate.reload import config_state
from prefixgate.serve.browsers import BrowserGuard
from prefixgate.serve.edge import send_refusal

log = logging.getLogger("prefixgate")


def create_app(gateway: Gateway | Config, **services) -> Starlette:
    """The app over ``gateway`` (or over ``Gateway.from_config(config, **services)``): its
    routes, and a lifespan that is ``async with gateway``."""
    if not isinstance(gateway, Gateway):
        gateway = Gateway.from_config(gateway, **services)
    config, events = gateway.config, gateway.events

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
        rendering = gateway.render_orders.renderings(gateway.config.channels)
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
        async with gateway:
            yield

    # The one route list; its inference routes are also the hot-route table below, which
    # reaches their handlers without Starlette's router.
    inference = [
        Route(path, pipeline.handler(gateway, endpoint), methods=["POST"])
        for path, endpoint in INFERENCE
    ]
    routes = [
        *inference,
        Route("/v1/models", _bound(models, gateway), methods=["GET"]),
        Route("/v1/me", me, methods=["GET"]),
        Route("/v1/diagnostics/{id}", _bound(diagnosis, gateway), methods=["GET"]),
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
    # LedgerWorker, or None without a store or events
    app.state.ledger = None if isinstance(gateway.ledger, NullLedger) else gateway.ledger
    hot = {route.path: route.endpoint for route in inference}
    outer = HeaderLimit(HotRoutes(app, hot), config.limits.max_header_bytes)
    if config.open_access:  # no key to ask for: refuse what only a web page would send
        outer = BrowserGuard(outer, config.server.host, _shape_of)
    return AccessLog(outer) if config.server.access_log else outer


INFERENCE = (  # path, endpoint (each API's endpoint.py)
    ("/v1/messages", messages.ENDPOINT),
    ("/v1/messages/count_tokens", messages.COUNT_TOKENS),
    ("/v1/chat/completions", chat.ENDPOINT),
    ("/chat/completions", chat.ENDPOINT),
    ("/v1/responses", responses.ENDPOINT),
    ("/responses", responses.ENDPOINT),
    ("/v1/responses/compact", responses.COMPACT),
    ("/responses/compact", responses.COMPACT),
)


def _bound(endpoint, gateway: Gateway):
    """A route handler of ``endpoint(gateway, request)``."""

    async def handle(request: Request) -> Response:
        return await endpoint(gateway, request)

    handle.__name__ = handle.__qualname__ = endpoint.__name__
    return handle


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


_NAME, _VALUE = itemgetter(0), itemgetter(1)
_LATIN1 = methodcaller("decode", "latin-1")


class IndexedHeaders(Headers):
    """Starlette's request headers, looked up in a dict built once instead of a scan of
    the list per lookup (a request handler asks for a dozen, most of them absent). ASGI
    servers give header names in lower case."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._list = raw
        # built in C; from the last header to the first, so that the first of a name
        # stays (as Headers.get gives)
        last_first = raw[::-1]
        self._index: dict[str, str] = dict(
            zip(
                map(_LATIN1, map(_NAME, last_first)),
                map(_LATIN1, map(_VALUE, last_first)),
                strict=True,
            )
        )

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
            size = sum(map(len, chain.from_iterable(scope["headers"])))
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
