"""``/dashboard``: the pages, their JSON API and their static files, behind admin auth.

Auth (web/login.py): an admin session opened by the login form (browsers), or the admin
key in ``x-api-key`` / ``Authorization: Bearer`` (scripts); never the key in a URL. An
open loopback gateway without an admin key is open to everyone, as ``/metrics``.
Store reads run in a thread each, through a store opened for the call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from prefixgate.errors import AuthenticationFailed, GatewayError, InvalidRequest
from prefixgate.store import StoreError, open_store
from prefixgate.web import ledger as ledger_view
from prefixgate.web import pages, queries
from prefixgate.web import upstream as upstream_mod
from prefixgate.web.console import Console, check_post, read_json
from prefixgate.web.login import KEY_IN_URL, AdminGate
from prefixgate.web.me import HolderFindings
from prefixgate.web.pages import SECURITY_HEADERS
from prefixgate.web.scope import BadParam, dimension_of, scope_of

PREFIX = "/dashboard"
DOCTOR_TTL = 30.0  # seconds a diagnosis is reused for the same window
L2_TTL = 15.0
STATIC_TYPES = {
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}
_json = msgspec.json.Encoder()


def _json_response(obj: Any, status: int = 200, retry_after: float | None = None) -> Response:
    headers = {"cache-control": "no-store", **SECURITY_HEADERS}
    if retry_after is not None:
        headers["retry-after"] = str(int(retry_after))
    return Response(
        _json.encode(obj), status_code=status, media_type="application/json", headers=headers
    )


def _static_files() -> dict[str, bytes]:
    root = resources.files("prefixgate.web") / "static"
    return {
        f.name: f.read_bytes()
        for f in root.iterdir()
        if f.is_file() and any(f.name.endswith(ext) for ext in STATIC_TYPES)
    }


class _TTLCache:
    """A few recent results by key, each kept ``ttl`` seconds (state of one dashboard)."""

    def __init__(self, ttl: float, size: int = 16) -> None:
        self.ttl, self.size = ttl, size
        self._items: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any) -> Any:
        hit = self._items.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        return None

    def put(self, key: Any, value: Any) -> None:
        if len(self._items) >= self.size:
            self._items.pop(next(iter(self._items)))
        self._items[key] = (time.monotonic() + self.ttl, value)


class Dashboard:
    def __init__(self, gateway: Any, store_dsn: str, holders: HolderFindings | None = None) -> None:
        self.gateway = gateway
        self.dsn = store_dsn
        self.static = _static_files()
        self._doctor = _TTLCache(DOCTOR_TTL)
        self._l2 = _TTLCache(L2_TTL)
        self.gate = AdminGate(gateway, store_dsn, PREFIX)
        self.console = Console(gateway, store_dsn)
        self.holders = holders if holders is not None else HolderFindings(store_dsn)

    def page(self, name: str) -> Callable:
        async def handler(request: Request) -> Response:
            err = await self.gate.denied(request)
            if err is not None:
                return self.gate.refusal(request, err)
            rid = request.path_params.get("request_id", "")
            logout = self.gate.has_session(request)
            return pages.html_response(pages.render(PREFIX, name, request_id=rid, logout=logout))

        return handler

    def api(self, fn: Callable[[Request], Any]) -> Callable:
        async def handler(request: Request) -> Response:
            err = await self.gate.denied(request)
            if err is not None:
                retry = getattr(err, "retry_after", None)
                return _json_response({"error": str(err)}, err.status, retry)
            try:
                result = await fn(request)
            except BadParam as exc:
                return _json_response({"error": str(exc)}, 400)
            except StoreError as exc:
                return _json_response({"error": f"store unavailable: {exc}"}, 503)
            if result is None:
                return _json_response({"error": "not found"}, 404)
            return _json_response(result)

        return handler

    def change(self, fn: Callable[[Request, dict], Any]) -> Callable:
        """A POST of the admin API: the admin's, from this origin, a JSON object body."""

        async def handler(request: Request) -> Response:
            err = await self.gate.denied(request)
            if err is not None:
                return _json_response({"error": str(err)}, err.status)
            try:
                check_post(request)
                result = await fn(request, await read_json(request))
            except GatewayError as exc:
                return _json_response({"error": exc.message}, exc.status)
            except StoreError as exc:
                return _json_response({"error": f"store unavailable: {exc}"}, 503)
            return _json_response(result)

        return handler

    # -- a key holder's own view (web/me.py) ------------------------------------------------
    async def me_page(self, request: Request) -> Response:
        if "key" in request.query_params:
            return self.gate.refusal(request, InvalidRequest(KEY_IN_URL))
        holder = await self.gate.holder(request)
        if holder is None:
            err = AuthenticationFailed("sign in with your API key to see your own usage")
            return self.gate.refusal(request, err)
        return pages.html_response(pages.render(PREFIX, "me", logout=True))

    async def me_api(self, request: Request) -> Response:
        if "key" in request.query_params:
            return _json_response({"error": KEY_IN_URL}, 400)
        holder = await self.gate.holder(request)
        if holder is None:
            return _json_response({"error": "sign in with your API key"}, 401)
        try:
            out = await me_of(self.gateway, self.dsn, holder, request, self.holders)
            return _json_response(out)
        except StoreError as exc:
            return _json_response({"error": f"store unavailable: {exc}"}, 503)

    # -- store access ------------------------------------------------------------------
    async def _read(self, fn: Callable, *args: Any, **kw: Any) -> Any:
        def run() -> Any:
            with open_store(self.dsn) as store:
                if store.schema_version() == 0:
                    raise StoreError("the store is empty: no request recorded yet")
                return fn(store, *args, **kw)

        return await asyncio.to_thread(run)

    # -- API ---------------------------------------------------------------------------
    async def meta(self, request: Request) -> Any:
        scope = scope_of(request.query_params)
        out = await self._read(queries.meta, scope)
        out["channels"] = [c.name for c in self.gateway.config.channels]
        return out

    async def overview(self, request: Request) -> Any:
        scope = scope_of(request.query_params)
        by, _ = dimension_of(request.query_params)

        def read(store) -> dict:
            out = queries.overview(store, scope, by)
            out["ledger"] = ledger_view.series(store, scope, out["series"])
            return out

        return await self._read(read)

    async def distribution(self, request: Request) -> Any:
        scope = scope_of(request.query_params)
        by, _ = dimension_of(request.query_params)
        return await self._read(queries.distribution, scope, by)

    async def doctor(self, request: Request) -> Any:
        from prefixgate.doctor import diagnose

        q = request.query_params
        scope = scope_of(q)
        urls = tuple(c.metrics_url for c in self.gateway.config.channels if c.metrics_url)
        key = (q.get("since", ""), q.get("until", ""))
        cached = None if q.get("refresh") else self._doctor.get(key)
        if cached is not None:
            return cached
        policies = {c.name: c.routing.policy for c in self.gateway.config.channels}
        d = await asyncio.to_thread(
            diagnose,
            self.dsn,
            since=scope.since,
            until=scope.until,
            metrics_urls=urls,
            policies=policies,
        )
        out = d.to_dict()
        self._doctor.put(key, out)
        return out

    async def upstream(self, request: Request) -> Any:
        scope = scope_of(request.query_params)
        stats = await self._read(queries.upstream_stats, scope)
        return upstream_mod.view(self.gateway, stats, await self._l2_all())

    async def _l2_all(self) -> dict[str, dict]:
        chans = [c for c in self.gateway.config.channels if c.metrics_url]
        cached = self._l2.get("all")
        if cached is not None or not chans:
            return cached or {}
        results = await asyncio.gather(
            *(asyncio.to_thread(upstream_mod.l2_status, c.metrics_url) for c in chans)
        )
        out = {c.name: r for c, r in zip(chans, results, strict=True)}
        self._l2.put("all", out)
        return out

    async def requests(self, request: Request) -> Any:
        q = request.query_params
        scope = scope_of(q)
        try:
            limit = int(q.get("limit", "100"))
        except ValueError:
            raise BadParam("limit must be a number") from None
        return await self._read(queries.request_log, scope, limit=limit, before=q.get("before"))

    async def usage(self, request: Request) -> Any:
        """The usage report (spend/usage_report.py) for the scope, grouped by ``by``."""
        from prefixgate.spend.usage_report import DIMENSIONS, usage_report

        q = request.query_params
        scope = scope_of(q)
        by = q.get("by") or "key"
        if by not in DIMENSIONS:
            raise BadParam(f"cannot group by {by!r}: want one of {', '.join(DIMENSIONS)}")
        where, params = scope.where()
        prices = self.gateway.prices
        report = await self._read(
            usage_report,
            by,
            where=where,
            params=params,
            prices=prices,
            since=scope.since,
            until=scope.until,
        )
        return report.to_dict()

    async def request_detail(self, request: Request) -> Any:
        request_id = request.path_params["request_id"]

        def read(store) -> dict | None:
            out = queries.request_detail(store, request_id)
            if out is not None:
                out["ledger"] = ledger_view.detail(store, request_id)
            return out

        return await self._read(read)

    async def texts(self, request: Request) -> Any:
        hashes = request.query_params.getlist("h")[:64]
        if not hashes:
            raise BadParam("give the segment hashes as h=…")

        def get(store) -> dict[str, str]:
            return store.get_texts(hashes)

        return {"texts": await self._read(get)}

    # -- static ------------------------------------------------------------------------
    async def static_file(self, request: Request) -> Response:
        name = request.path_params["name"]
        body = self.static.get(name)
        if body is None:
            return Response("not found", status_code=404, media_type="text/plain")
        ext = name[name.rfind(".") :]
        return Response(
            body,
            media_type=STATIC_TYPES[ext],
            headers={"cache-control": "no-cache", "x-content-type-options": "nosniff"},
        )


def dashboard_routes(
    gateway: Any, store_dsn: str, holders: HolderFindings | None = None
) -> list[BaseRoute]:
    """The dashboard's routes, to add to the gateway app's routes (``holders``: the key
    holders' findings, shared with ``GET /v1/me``)."""
    d = Dashboard(gateway, store_dsn, holders)
    p = PREFIX
    return [
        Route(p, d.page("overview"), methods=["GET"]),
        Route(p + "/", d.page("overview"), methods=["GET"]),
        Route(p + "/login", d.gate.login_page, methods=["GET"]),
        Route(p + "/login", d.gate.login, methods=["POST"]),
        Route(p + "/logout", d.gate.logout, methods=["POST"]),
        Route(p + "/distribution", d.page("distribution"), methods=["GET"]),
        Route(p + "/doctor", d.page("doctor"), methods=["GET"]),
        Route(p + "/upstream", d.page("upstream"), methods=["GET"]),
        Route(p + "/requests", d.page("requests"), methods=["GET"]),
        Route(p + "/requests/{request_id}", d.page("request"), methods=["GET"]),
        Route(p + "/usage", d.page("usage"), methods=["GET"]),
        Route(p + "/keys", d.page("keys"), methods=["GET"]),
        Route(p + "/api/meta", d.api(d.meta), methods=["GET"]),
        Route(p + "/api/overview", d.api(d.overview), methods=["GET"]),
        Route(p + "/api/distribution", d.api(d.distribution), methods=["GET"]),
        Route(p + "/api/doctor", d.api(d.doctor), methods=["GET"]),
        Route(p + "/api/upstream", d.api(d.upstream), methods=["GET"]),
        Route(p + "/api/requests", d.api(d.requests), methods=["GET"]),
        Route(p + "/api/requests/{request_id}", d.api(d.request_detail), methods=["GET"]),
        Route(p + "/api/texts", d.api(d.texts), methods=["GET"]),
        Route(p + "/api/usage", d.api(d.usage), methods=["GET"]),
        Route(p + "/api/keys", d.api(d.console.keys), methods=["GET"]),
        Route(p + "/api/keys", d.change(d.console.create), methods=["POST"]),
        Route(p + "/api/keys/{name}/rotate", d.change(d.console.rotate), methods=["POST"]),
        Route(p + "/api/keys/{name}/revoke", d.change(d.console.revoke), methods=["POST"]),
        Route(p + "/api/keys/{name}/budgets", d.change(d.console.set_budgets), methods=["POST"]),
        Route(
            p + "/api/owners/{owner}/budgets",
            d.change(d.console.set_owner_budgets),
            methods=["POST"],
        ),
        Route(p + "/api/audit", d.api(d.console.audit), methods=["GET"]),
        Route(p + "/me", d.me_page, methods=["GET"]),
        Route(p + "/api/me", d.me_api, methods=["GET"]),
        Route(p + "/static/{name}", d.static_file, methods=["GET"]),
    ]


async def me_of(gateway: Any, dsn: str, principal: Any, request: Request, findings: Any) -> dict:
    """A key holder's own figures (web/me.py) since ``?days=`` (a week by default), and
    the doctor's findings about their records (``findings``: a
    :class:`~prefixgate.web.me.HolderFindings`)."""
    from prefixgate.spend.budgets import parse_budget
    from prefixgate.web import me

    config = gateway.config
    currency = config.prices.currency if config.prices is not None else "USD"
    budgets = {("key", principal.name): principal.budgets}
    owner = principal.owner
    if owner and principal.owner_budgets is not None:  # the console's
        budgets[("owner", owner)] = principal.owner_budgets
    elif owner and owner in config.budgets.owners:
        lines = config.budgets.owners[owner]
        budgets[("owner", owner)] = tuple(parse_budget(b, currency) for b in lines)
    days = me.days_of(request.query_params.get("days"))
    since = time.time() - days * 86400.0
    policies = {c.name: c.routing.policy for c in config.channels}

    def read() -> dict:
        with open_store(dsn) as store:
            store.migrate()
            out = me.view(
                store,
                principal,
                since=since,
                budgets=budgets,
                currency=currency,
                shared=config.budgets_shared,
            )
        out["findings"] = findings.of(principal.name, days, out["requests"], policies)
        return out

    return await asyncio.to_thread(read)
