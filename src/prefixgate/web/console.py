"""The console: the admin's keys and budgets, and owners' budgets, in the dashboard
(``/dashboard/keys``) and the admin JSON API the page itself uses (``/dashboard/api/keys…``,
``/dashboard/api/owners/{owner}/budgets``, ``/dashboard/api/audit``), so every action can
be scripted.

A key is made here and shown once, in the answer that created (or rotated) it; the store
keeps its SHA-256 digest. Every change goes into the store's audit log (who, when, what,
to which key: names, budgets and a digest's first characters, never a key). A POST must
come from the dashboard's own origin (``login.same_origin``) or carry no browser origin
at all (a script with the admin key in a header). The worker that made a change applies
it to its keys at once; the other workers read the store's keys (and owners' budgets)
before their next request (``auth.KeyEpoch``), other gateways on the store within seconds
(``auth.refresh_keys``)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
import secrets
import time
from typing import Any

import msgspec
from starlette.requests import Request

from prefixgate.auth import store_keys
from prefixgate.errors import GatewayError, InvalidRequest, NotFound, PermissionDenied
from prefixgate.store import StoreError, open_store
from prefixgate.web.login import COOKIE, same_origin

MAX_BODY = 16 * 1024
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
KEY_PREFIX = "pg-"


class Conflict(GatewayError):
    status = 409
    kind = "invalid_request_error"


class Console:
    def __init__(self, gateway: Any, dsn: str) -> None:
        self.gateway = gateway
        self.dsn = dsn

    # -- reads ---------------------------------------------------------------------------
    async def keys(self, request: Request) -> dict:
        """Every store key (revoked ones too), its budgets with what is used and left in
        the current windows, its owner's budgets the same way; and every owner (of a key,
        or given budgets by the config or the console) with its budgets, where they come
        from, its keys, and what is used and left."""
        from prefixgate.spend.budgets import owner_lines
        from prefixgate.spend.prices import fmt_money
        from prefixgate.spend.standing import standing

        config = self.gateway.config
        currency = self._currency()

        def read():
            with open_store(self.dsn) as store:
                store.migrate()
                rows = store.list_keys()
                owners = owner_lines(config.budgets.owners, store.list_owner_budgets())
                budgets = {("key", r.name): _parsed(r.budgets, currency) for r in rows}
                for owner, (_, lines) in owners.items():
                    budgets[("owner", owner)] = _parsed(lines, currency)
                left = standing(store, budgets, currency, time.time(), config.budgets_shared)
                return rows, owners, left

        rows, owners, left = await asyncio.to_thread(read)

        def view(who) -> list[dict]:
            out = []
            for b, used, rest in left.get(who, ()):
                fmt = (lambda n: fmt_money(n, 6)) if b.money else (lambda n: n)
                out.append({"budget": b.text, "used": fmt(used), "left": fmt(rest)})
            return out

        keys_of: dict[str, list[str]] = {}
        for r in rows:
            if r.owner:
                keys_of.setdefault(r.owner, []).append(r.name)
        for k in config.keys:
            if k.owner:
                keys_of.setdefault(k.owner, []).append(k.name)
        return {
            "currency": currency,
            "keys": [
                {
                    "name": r.name,
                    "owner": r.owner,
                    "models": list(r.models),
                    "digest_prefix": r.digest[:8],
                    "created_at": r.created_at,
                    "revoked_at": r.revoked_at,
                    "active": r.active,
                    "budgets": view(("key", r.name)),
                    "owner_budgets": view(("owner", r.owner)) if r.owner else [],
                }
                for r in rows
            ],
            "owners": [
                {
                    "owner": owner,
                    "source": owners[owner][0] if owner in owners else None,
                    "keys": sorted(keys_of.get(owner, ())),
                    "budgets": view(("owner", owner)),
                }
                for owner in sorted(set(keys_of) | set(owners))
            ],
        }

    async def audit(self, request: Request) -> dict:
        def read():
            with open_store(self.dsn) as store:
                store.migrate()
                return store.list_audit(200)

        rows = await asyncio.to_thread(read)
        return {"entries": [dataclasses.asdict(r) for r in rows]}

    # -- changes -------------------------------------------------------------------------
    async def create(self, request: Request, body: dict) -> dict:
        name = _name(body.get("name"))
        owner = body.get("owner") or None
        if owner is not None:
            owner = _name(owner, "owner")
        models = _strings(body.get("models"), "models")
        budgets = self._budgets(body.get("budgets"))
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        digest = hashlib.sha256(key.encode()).hexdigest()

        def write(store):
            try:
                store.create_key(name, owner, digest, models, budgets)
            except StoreError as exc:
                raise Conflict(str(exc)) from None
            detail = f"owner={owner or '-'} models={','.join(models) or '*'}"
            detail += f" budgets={'; '.join(budgets) or '-'} sha256={digest[:8]}…"
            store.add_audit(_actor(request), "create", name, detail)

        await self._change(write)
        return {"name": name, "key": key, "shown_once": True}

    async def rotate(self, request: Request, body: dict) -> dict:
        name = request.path_params["name"]
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        digest = hashlib.sha256(key.encode()).hexdigest()

        def write(store):
            if not store.rotate_key(name, digest):
                raise NotFound(f"no active key named {name!r}")
            store.add_audit(_actor(request), "rotate", name, f"sha256={digest[:8]}…")

        await self._change(write)
        return {"name": name, "key": key, "shown_once": True}

    async def revoke(self, request: Request, body: dict) -> dict:
        name = request.path_params["name"]

        def write(store):
            if not store.revoke_key(name):
                raise NotFound(f"no active key named {name!r}")
            store.add_audit(_actor(request), "revoke", name, "")

        await self._change(write)
        return {"name": name, "revoked": True}

    async def set_budgets(self, request: Request, body: dict) -> dict:
        name = request.path_params["name"]
        budgets = self._budgets(body.get("budgets"))

        def write(store):
            if not store.set_key_budgets(name, budgets):
                raise NotFound(f"no active key named {name!r}")
            store.add_audit(_actor(request), "budgets", name, "; ".join(budgets) or "none")

        await self._change(write)
        return {"name": name, "budgets": budgets}

    async def set_owner_budgets(self, request: Request, body: dict) -> dict:
        """Give an owner budgets (every key of that owner must fit them, together), in
        place of the config's for that owner; none: the config's apply again."""
        if not self.gateway.config.store_keys:
            raise InvalidRequest(
                "owners' budgets set here need `store_keys: true` (the gateway reads them "
                "from the store with its keys); without it, set `budgets.owners` in the config"
            )
        owner = _name(request.path_params["owner"], "owner")
        budgets = self._budgets(body.get("budgets"))

        def write(store):
            store.set_owner_budgets(owner, budgets)
            detail = "; ".join(budgets) or "none (the config's apply)"
            store.add_audit(_actor(request), "owner budgets", f"owner {owner}", detail)

        await self._change(write)
        return {"owner": owner, "budgets": budgets}

    # -- helpers -------------------------------------------------------------------------
    async def _change(self, write) -> None:
        """Run ``write`` against the store, then give this worker the store's keys now."""

        def run():
            with open_store(self.dsn) as store:
                store.migrate()
                write(store)
                return store_keys(store)

        self.gateway.auth.set_store_keys(*await asyncio.to_thread(run))
        if self.gateway.key_epoch is not None:  # the other workers, before their next request
            self.gateway.key_epoch.bump()

    def _currency(self) -> str:
        prices = self.gateway.prices
        return prices.currency if prices is not None else "USD"

    def _budgets(self, value) -> list[str]:
        from prefixgate.spend.budgets import BudgetSyntaxError, parse_budget

        lines = _strings(value, "budgets")
        for text in lines:
            try:
                budget = parse_budget(text, self._currency())
            except BudgetSyntaxError as exc:
                raise InvalidRequest(f"budget {text!r}: {exc}") from None
            if budget.money and self.gateway.prices is None:
                raise InvalidRequest(f"budget {text!r} is money: the gateway has no price table")
        return lines


async def read_json(request: Request) -> dict:
    """A small JSON object body (an empty body is ``{}``), bounded."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise InvalidRequest(f"the body is larger than {MAX_BODY} bytes")
    if not body.strip():
        return {}
    try:
        out = msgspec.json.decode(bytes(body))
    except msgspec.DecodeError:
        raise InvalidRequest("the body is not JSON") from None
    if not isinstance(out, dict):
        raise InvalidRequest("the body must be a JSON object")
    return out


def check_post(request: Request) -> None:
    """A change from another site's page is refused (a browser's ``Origin``/``Referer``
    must name this host)."""
    if not same_origin(request):
        raise PermissionDenied("a change from another site is refused")


def _actor(request: Request) -> str:
    """Who made the change, for the audit log: the admin's session or the admin key, and
    the address it came from."""
    if "authorization" in request.headers or "x-api-key" in request.headers:
        how = "admin key"
    else:
        how = "admin session" if COOKIE in request.cookies else "open gateway"
    return f"{how} from {request.client.host if request.client else 'unknown'}"


def _name(value, what: str = "name") -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise InvalidRequest(
            f"{what} must be 1 to 64 letters, digits or . _ @ - (starting with a letter or digit)"
        )
    return value


def _strings(value, what: str) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        value = re.split(r"[\n,]", value)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequest(f"{what} must be a list of strings")
    out = [v.strip() for v in value if v.strip()]
    if len(out) > 32 or any(len(v) > 200 for v in out):
        raise InvalidRequest(f"{what}: at most 32, each at most 200 characters")
    return out


def _parsed(lines, currency: str) -> tuple:
    from prefixgate.spend.budgets import BudgetSyntaxError, parse_budget

    out = []
    for text in lines:
        try:
            out.append(parse_budget(text, currency))
        except BudgetSyntaxError:
            continue  # said where the gateway loads the key
    return tuple(out)


__all__ = ["Console", "check_post", "read_json"]
