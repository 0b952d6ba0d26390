"""Guessing the admin key, bounded: every admin credential check (``Authorization`` or
``x-api-key`` on ``/metrics``, ``/healthz?details``, the dashboard and its JSON API, and
the login form) counts its failures per client address and in all.

- Past ``per_address`` failures within ``window`` seconds, an address is answered 429
  (with ``retry-after``) without its key being looked at, until its oldest failure ages out.
- Past ``in_all`` failures within the window from every address together (many addresses
  guessing), only addresses where the admin key was right within the last day are still
  checked: the real admin keeps working while the guessing is refused.
- Behind a proxy every client has the proxy's address: :func:`client_address` reads the
  client's own from ``X-Forwarded-For`` when the connection comes from one of
  ``server.trusted_proxies``, so that one guesser does not lock the admin out.

With a store (``store.dsn``) the counts are kept there (:class:`StoredAttempts`), so the
bounds hold across the workers of ``serve --workers N`` and every gateway on the same
store: each check is counted as a failure before the key is compared, atomically with
the bounds' check (a burst of parallel guesses on several workers is counted exactly),
and taken back when the key was right. While the store cannot be reached, each worker
counts in memory (:class:`AdminAttempts`), as without a store; that memory is bounded
(``max_addresses`` addresses, the oldest forgotten first).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from prefixgate.errors import RateLimited
from prefixgate.logthrottle import LogThrottle

if TYPE_CHECKING:
    from prefixgate.store.base import Store

log = logging.getLogger("prefixgate")

REMEMBER_GOOD = 86400.0  # s an address where the admin key was right stays trusted


class AdminAttempts:
    def __init__(
        self,
        per_address: int = 10,
        in_all: int = 100,
        window: float = 60.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_addresses: int = 10_000,
    ) -> None:
        self.per_address = per_address
        self.in_all = in_all
        self.window = window
        self.clock = clock
        self.max_addresses = max_addresses
        self._failed: OrderedDict[str, deque[float]] = OrderedDict()
        self._all: deque[float] = deque(maxlen=in_all)
        self._good: OrderedDict[str, float] = OrderedDict()

    def check(self, address: str) -> None:
        """Raise :class:`RateLimited` when ``address`` may not try a key now."""
        now = self.clock()
        failed = self._failed.get(address)
        if failed is not None:
            _age(failed, now - self.window)
            if len(failed) >= self.per_address:
                raise RateLimited(
                    "too many wrong admin keys from this address: wait a minute",
                    retry_after=max(1.0, failed[0] + self.window - now),
                )
        _age(self._all, now - self.window)
        if len(self._all) >= self.in_all and not self._trusted(address, now):
            raise RateLimited(
                "too many wrong admin keys from everywhere: wait a minute",
                retry_after=max(1.0, self._all[0] + self.window - now),
            )

    def failed(self, address: str) -> None:
        now = self.clock()
        failed = self._failed.pop(address, None)
        if failed is None:
            failed = deque(maxlen=self.per_address)
            if len(self._failed) >= self.max_addresses:
                self._failed.popitem(last=False)
        self._failed[address] = failed  # the most recent last
        failed.append(now)
        self._all.append(now)

    def succeeded(self, address: str) -> None:
        self._good.pop(address, None)
        self._good[address] = self.clock()
        if len(self._good) > self.max_addresses:
            self._good.popitem(last=False)

    def _trusted(self, address: str, now: float) -> bool:
        seen = self._good.get(address)
        return seen is not None and now - seen < REMEMBER_GOOD

    def close(self) -> None:
        pass  # nothing held

    # The interface the admin check uses (:class:`StoredAttempts` has the same).
    async def begin(self, address: str) -> str | None:
        """Before the key is compared: raise :class:`RateLimited` past the bounds."""
        self.check(address)
        return None

    async def wrong(self, address: str, attempt: str | None) -> None:
        self.failed(address)

    async def right(self, address: str, attempt: str | None) -> None:
        self.succeeded(address)


class StoredAttempts:
    """The same bounds, counted in the store every worker and replica shares; in this
    worker's memory (``fallback``) while the store cannot be reached."""

    def __init__(
        self,
        dsn: str,
        per_address: int = 10,
        in_all: int = 100,
        window: float = 60.0,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.dsn = dsn
        self.per_address, self.in_all, self.window = per_address, in_all, window
        self.clock = clock
        self.fallback = AdminAttempts(per_address, in_all, window)
        self.failures = LogThrottle(log, interval=60.0)
        # opened at the first check, kept (thread-safe, reconnects)
        self._store: Store | None = None

    def _run(self, fn):
        if self._store is None:
            from prefixgate.store import open_store

            store = open_store(self.dsn)
            try:
                store.migrate()
            except BaseException:
                store.close()
                raise
            self._store = store
        return fn(self._store)

    def close(self) -> None:
        """Release the store's connection (the app's lifespan ends)."""
        store, self._store = self._store, None
        if store is not None:
            store.close()

    async def begin(self, address: str) -> str | None:
        attempt = secrets.token_hex(16)
        now = self.clock()

        def count(store):
            return store.admin_attempt(
                attempt,
                address,
                now,
                window=self.window,
                per_address=self.per_address,
                in_all=self.in_all,
                trusted_since=now - REMEMBER_GOOD,
            )

        try:
            wait = await asyncio.to_thread(self._run, count)
        except Exception as exc:  # the store is down: this worker counts alone meanwhile
            self.failures.warning("admin", "admin attempts counted per worker: %s", exc)
            await self.fallback.begin(address)
            return None
        if wait is not None:
            raise RateLimited("too many wrong admin keys: wait a minute", retry_after=wait)
        return attempt

    async def wrong(self, address: str, attempt: str | None) -> None:
        if attempt is None:  # counted in memory
            await self.fallback.wrong(address, None)
        # else: counted already, by begin()

    async def right(self, address: str, attempt: str | None) -> None:
        if attempt is None:
            await self.fallback.right(address, None)
            return
        now = self.clock()

        def forget(store):
            store.admin_success(attempt, address, now, forget=REMEMBER_GOOD)

        try:
            await asyncio.to_thread(self._run, forget)
        except Exception as exc:
            self.failures.warning("admin", "admin attempts counted per worker: %s", exc)
            await self.fallback.right(address, None)


def admin_attempts(config) -> AdminAttempts | StoredAttempts:
    """The admin checks' bounds for ``config``: in its store when it has one."""
    server = config.server
    per, every = server.admin_failures_per_minute, server.admin_failures_in_all_per_minute
    if config.store is not None:
        return StoredAttempts(config.store.dsn, per, every)
    return AdminAttempts(per, every)


def _age(times: deque[float], before: float) -> None:
    while times and times[0] <= before:
        times.popleft()


def client_address(scope: dict, trusted: tuple = ()) -> str:
    """The client's address: the connection's peer, or, when the peer is a trusted proxy,
    the nearest address in ``X-Forwarded-For`` that is not one."""
    client = scope.get("client")
    peer = client[0] if client else "unknown"
    if not trusted or not _within(peer, trusted):
        return peer
    hops: list[str] = []
    for name, value in scope.get("headers", ()):
        if name == b"x-forwarded-for":
            hops += [h.strip() for h in value.decode("latin-1").split(",")]
    for hop in reversed(hops):
        if not _within(hop, trusted):
            return hop
    return peer


def _within(address: str, networks: tuple) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in networks)


def networks(specs: list[str]) -> tuple:
    """``server.trusted_proxies`` (addresses or CIDR blocks) as networks."""
    return tuple(ipaddress.ip_network(s, strict=False) for s in specs)
