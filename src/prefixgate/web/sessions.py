"""The dashboard's admin sessions: what a login opens and what the cookie names.

A session is a random token (``secrets.token_urlsafe``) given to the browser once, in its
cookie; the store keeps only the token's SHA-256 digest, so a copy of the database opens
nothing. Rows live in the store (``dashboard_sessions``), not in this process, so every
worker and every gateway replica on the same store accepts a session, and a logout on one
ends it on all. A session ends when idle for ``session_idle_seconds``, when
``session_max_seconds`` have passed since its login, at logout, and when the admin key
changes: each row carries a fingerprint of the key it was opened with.

Every method is synchronous (the store's calls are); the routes run them in a thread.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable

from prefixgate.config import DashboardConfig
from prefixgate.store import open_store
from prefixgate.store.base import SessionRow, Store

TOKEN_BYTES = 32
MAX_TOKEN_CHARS = 128  # a longer cookie is no token of ours: refused without a lookup
ATTEMPT_WINDOW = 60.0  # seconds over which login attempts are counted
TOUCH_EVERY = 60.0  # at most one last_seen write a minute per session


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def admin_fingerprint(admin_digest: str) -> str:
    """Names the admin key a session was opened with, without being its digest (which
    is the config's secret-equivalent for a weak key)."""
    return hashlib.sha256(b"prefixgate dashboard session\0" + admin_digest.encode()).hexdigest()


class Sessions:
    def __init__(
        self,
        dsn: str,
        admin_digest: str,
        config: DashboardConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.dsn = dsn
        self.admin = admin_fingerprint(admin_digest)
        self.idle = config.session_idle_seconds
        self.lifetime = config.session_max_seconds
        self.attempts = config.login_attempts_per_minute
        self.clock = clock
        self.touch_every = min(TOUCH_EVERY, self.idle / 10)
        self._migrated = False

    def _store(self) -> Store:
        store = open_store(self.dsn)
        if not self._migrated:  # once per process: migrate() is idempotent and serialised
            try:
                store.migrate()
            except BaseException:
                store.close()
                raise
            self._migrated = True
        return store

    def attempt(self, address: str) -> bool:
        """Count a login attempt from ``address``; False past the per-minute limit."""
        with self._store() as store:
            return store.login_attempt(
                address, self.clock(), window=ATTEMPT_WINDOW, limit=self.attempts
            )

    def open(self) -> str:
        """A new session's token, for the cookie; the store keeps its digest."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        now = self.clock()
        row = SessionRow(token_digest(token), self.admin, now, now, now + self.lifetime)
        with self._store() as store:
            store.prune_sessions(now, self.idle)
            store.create_session(row)
        return token

    def valid(self, token: str) -> bool:
        """Whether ``token`` names a live session of the current admin key; a live one's
        idle lifetime starts again, an expired one is deleted."""
        if not token or len(token) > MAX_TOKEN_CHARS:
            return False
        digest = token_digest(token)
        now = self.clock()
        with self._store() as store:
            row = store.get_session(digest)
            if row is None or row.admin != self.admin:
                # Another key's session is left alone: during a rolling key change, the
                # replicas still on the other key accept it until they move.
                return False
            if now >= row.expires_at or now - row.last_seen >= self.idle:
                store.delete_session(digest)
                return False
            if now - row.last_seen >= self.touch_every:
                store.touch_session(digest, now)
            return True

    def close(self, token: str) -> None:
        """End the session of ``token`` (logout), if it is one."""
        if token and len(token) <= MAX_TOKEN_CHARS:
            with self._store() as store:
                store.delete_session(token_digest(token))
