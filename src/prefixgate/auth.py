"""Who is calling: API keys checked by digest, per-key model allowlists, the admin key.

Keys are only ever held as SHA-256 digests. The presented key is hashed and looked up by
digest, so the comparison never touches the secret itself; the digest comparison for the
admin key uses ``hmac.compare_digest``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
from dataclasses import dataclass, replace

from prefixgate.admin_attempts import admin_attempts, client_address, networks
from prefixgate.config import Config
from prefixgate.errors import AuthenticationFailed, PermissionDenied
from prefixgate.ratelimit import Limits
from prefixgate.spend.budgets import Budget, BudgetSyntaxError, parse_budget

log = logging.getLogger("prefixgate")


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    owner: str | None = None
    models: tuple[str, ...] = ()
    capture_text: bool = False
    limits: Limits = Limits()
    budgets: tuple[Budget, ...] = ()
    # The owner's budgets when the console gave them (they take the place of the config's
    # ``budgets.owners`` entry); None: the config's apply.
    owner_budgets: tuple[Budget, ...] | None = None

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models


ANONYMOUS = Principal(name="anonymous")

# What ``prefixgate keys new`` / ``keys create`` print: a prefix (``pg-`` by default) and
# 43 characters of ``secrets.token_urlsafe(32)``.
ISSUED_KEY = re.compile(r"[A-Za-z0-9_]{0,16}-[A-Za-z0-9_\-]{43}")


def presented_key(headers) -> str | None:
    key = headers.get("x-api-key")
    if key:
        return key.strip()
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return None


class Authenticator:
    """Keys from the config file, plus keys managed in the store (``prefixgate keys``),
    which :func:`refresh_keys` reloads periodically so that new and revoked keys take
    effect without a restart."""

    def __init__(self, config: Config) -> None:
        self._open = config.open_access
        self._currency = config.prices.currency if config.prices is not None else "USD"
        self._by_digest = {
            k.digest(): Principal(
                k.name,
                k.owner,
                tuple(k.models),
                k.capture_text,
                Limits(k.rpm, k.tpm, k.max_concurrency),
                tuple(parse_budget(b, self._currency) for b in k.budgets),
            )
            for k in config.keys
        }
        self._config_keys = self._by_digest  # as the config gives them
        self._from_store: dict[str, Principal] = {}
        self._rows: tuple = ()  # the store's key rows last loaded
        self._owner_lines: dict[str, tuple[str, ...]] = {}  # the store's owner budgets
        self._owners: dict[str, tuple[Budget, ...]] = {}  # those parsed
        self._admin = config.admin_digest()
        self.attempts = admin_attempts(config)
        self.trusted_proxies = networks(config.server.trusted_proxies)

    def set_store_keys(self, rows, owners: dict[str, tuple[str, ...]] | None = None) -> None:
        """Replace the store-managed keys (active :class:`~prefixgate.store.base.KeyRow`s)
        and, when given, the owners' budgets set in the store (owner -> budget lines),
        which every key of that owner carries from now on."""
        self._rows = tuple(rows)
        if owners is not None:
            self._owner_lines = dict(owners)
            self._owners = {
                o: self._parsed(lines, f"owner {o!r}") for o, lines in self._owner_lines.items()
            }
        self._from_store = {
            r.digest: self._with_owner(
                Principal(
                    r.name,
                    r.owner,
                    tuple(r.models),
                    budgets=self._parsed(r.budgets, f"key {r.name!r}"),
                )
            )
            for r in rows
            if r.active
        }
        self._by_digest = {d: self._with_owner(p) for d, p in self._config_keys.items()}

    def _with_owner(self, principal: Principal) -> Principal:
        found = self._owners.get(principal.owner) if principal.owner else None
        return principal if found is None else replace(principal, owner_budgets=found)

    def adopt(self, previous: Authenticator) -> None:
        """After a reload: the store's keys and owners' budgets as ``previous`` last loaded
        them (parsed again with this config's currency), until the next refresh; and the
        admin key's failed attempts, so a reload never resets a guesser's count."""
        self.set_store_keys(previous._rows, previous._owner_lines)
        self.attempts = previous.attempts

    def _parsed(self, lines, whose: str) -> tuple[Budget, ...]:
        out = []
        for text in lines:
            try:
                out.append(parse_budget(text, self._currency))
            except BudgetSyntaxError as exc:  # the console checks; a hand-edited row may not
                log.warning("%s: budget ignored: %s", whose, exc)
        return tuple(out)

    def named(self, name: str) -> tuple[str, Principal] | None:
        """The digest and principal of the active key named ``name`` (a key holder's
        session is checked against the key's current digest: a rotated or revoked key
        ends it)."""
        for table in (self._by_digest, self._from_store):
            for digest, principal in table.items():
                if principal.name == name:
                    return digest, principal
        return None

    def principal_of(self, key: str) -> Principal | None:
        """The principal of an API key (not the admin key), or None."""
        if not key:
            return None
        digest = hashlib.sha256(key.encode()).hexdigest()
        return self._by_digest.get(digest) or self._from_store.get(digest)

    @property
    def open_access(self) -> bool:
        return self._open

    def authenticate(self, headers) -> Principal:
        key = presented_key(headers)
        if self._open:
            return ANONYMOUS
        if not key:
            raise AuthenticationFailed(
                "missing API key: send it in x-api-key or Authorization: Bearer"
            )
        digest = hashlib.sha256(key.encode()).hexdigest()
        principal = self._by_digest.get(digest) or self._from_store.get(digest)
        if principal is None:
            raise AuthenticationFailed("invalid API key")
        return principal

    def is_credential(self, value: str) -> bool:
        """Whether ``value`` is a key this gateway knows (the admin key, an API key) or has
        the shape of one it issues (``prefixgate keys new``), never compared in clear."""
        if ISSUED_KEY.fullmatch(value):
            return True
        digest = hashlib.sha256(value.encode()).hexdigest()
        if self._admin is not None and hmac.compare_digest(digest, self._admin):
            return True
        return digest in self._by_digest or digest in self._from_store

    def authorize_model(self, principal: Principal, model: str) -> None:
        if not principal.allows(model):
            raise PermissionDenied(f"this API key may not use model {model!r}")

    async def check_admin(self, headers, scope: dict | None = None) -> None:
        """The admin key in ``headers``; with the request's ASGI ``scope``, each key tried
        is counted for its client address (429 past the bounds of :mod:`.admin_attempts`,
        kept in the store when there is one: every worker counts alike)."""
        key = presented_key(headers)
        if self._admin is None:
            if self._open:
                return  # open access on loopback: admin routes open too
            raise PermissionDenied("admin routes are disabled: no admin key is configured")
        if not key:
            raise AuthenticationFailed("admin key required")
        if scope is None:
            if not self.is_admin_key(key):
                raise AuthenticationFailed("admin key required")
            return
        address = client_address(scope, self.trusted_proxies)
        attempt = await self.attempts.begin(address)
        if not self.is_admin_key(key):
            await self.attempts.wrong(address, attempt)
            raise AuthenticationFailed("admin key required")
        await self.attempts.right(address, attempt)

    def is_admin_key(self, key: str) -> bool:
        digest = hashlib.sha256(key.encode()).hexdigest()
        return self._admin is not None and hmac.compare_digest(digest, self._admin)


def store_keys(store) -> tuple[list, dict[str, tuple[str, ...]]]:
    """What :meth:`Authenticator.set_store_keys` takes, read from ``store``: its keys and
    its owners' budgets."""
    return store.list_keys(), store.list_owner_budgets()


async def refresh_keys(
    gateway, dsn: str, timeouts: tuple[float, float] | None = None, interval: float = 5.0
) -> None:
    """Reload the store's keys into the gateway's current authenticator every
    ``interval`` seconds, until cancelled (after a config reload, into the new one); a
    stalled store fails a round after ``timeouts`` (statement, lock) seconds."""
    from prefixgate.store import open_store

    statement, lock = timeouts or (None, None)

    def load():
        with open_store(dsn, statement_timeout=statement, lock_timeout=lock) as store:
            store.migrate()
            return store_keys(store)

    while True:
        try:
            gateway.auth.set_store_keys(*await asyncio.to_thread(load))
        except Exception as exc:  # keep the last known keys while the store is down
            log.warning("cannot reload API keys from the store: %s", exc)
        await asyncio.sleep(interval)


class KeyEpoch:
    """A counter the workers of one ``serve --workers N`` share (an anonymous shared
    memory page made before they fork): a worker that changed the store's keys (the
    console) bumps it, and every worker reads the store's keys again before it
    authenticates its next request, so a rotated or revoked key is refused at once on
    every worker, not at the next periodic refresh."""

    def __init__(self) -> None:
        import mmap

        self._page = mmap.mmap(-1, 8, flags=mmap.MAP_SHARED)
        self.seen = 0

    @property
    def value(self) -> int:
        return int.from_bytes(self._page[:8], "little")

    def moved(self) -> bool:
        return self.value != self.seen

    def bump(self) -> None:
        """After a change this worker already applied to itself."""
        self.seen = self.value + 1
        self._page[:8] = self.seen.to_bytes(8, "little")


async def fresh_store_keys(gateway) -> None:
    """When another worker changed the store's keys (``gateway.key_epoch`` moved): read
    them now, before this request is authenticated."""
    epoch = gateway.key_epoch
    target = epoch.value
    store = gateway.config.store
    from prefixgate.store import open_store

    def load():
        with open_store(store.dsn, statement_timeout=store.statement_timeout) as s:
            return store_keys(s)

    try:
        gateway.auth.set_store_keys(*await asyncio.to_thread(load))
    except Exception as exc:  # the periodic refresh tries again
        log.warning("cannot reload API keys from the store: %s", exc)
        return
    epoch.seen = target
