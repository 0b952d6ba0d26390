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


HOLDER = "key:"  # a key holder's session: "key:<name>:<fingerprint of the key's digest>"


def holder_mark(name: str, key_digest: str) -> str:
    """What a key holder's session row keeps: the key's name and a fingerprint of its
    digest (a rotated or revoked key no longer matches, so its sessions end)."""
    return f"{HOLDER}{name}:{admin_fingerprint(key_digest)}"


def holder_name(mark: str) -> str | None:
    if not mark.startswith(HOLDER):
        return None
    return mark[len(HOLDER) :].rsplit(":", 1)[0]


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

    def open(self, holder: str | None = None) -> str:
        """A new session's token, for the cookie; the store keeps its digest. ``holder``
        (:func:`holder_mark`): a key holder's session, scoped to that key."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        now = self.clock()
        row = SessionRow(token_digest(token), holder or self.admin, now, now, now + self.lifetime)
        with self._store() as store:
            store.prune_sessions(now, self.idle)
            store.create_session(row)
        return token

    def valid(self, token: str) -> bool:
        """Whether ``token`` names a live session of the current admin key; a live one's
        idle lifetime starts again, an expired one is deleted."""
        return self.owner(token) == self.admin

    def owner(self, token: str) -> str | None:
        """Whose live session ``token`` names: the admin key's fingerprint or a key
        holder's mark (:func:`holder_mark`); None when none is live. A live one's idle
        lifetime starts again, an expired one is deleted."""
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        digest = token_digest(token)
        now = self.clock()
        with self._store() as store:
            row = store.get_session(digest)
            if row is None or (row.admin != self.admin and not row.admin.startswith(HOLDER)):
                # Another key's session is left alone: during a rolling key change, the
                # replicas still on the other key accept it until they move.
                return None
            if now >= row.expires_at or now - row.last_seen >= self.idle:
                store.delete_session(digest)
                return None
            if now - row.last_seen >= self.touch_every:
                store.touch_session(digest, now)
            return row.admin

    def close(self, token: str) -> None:
        """End the session of ``token`` (logout), if it is one."""
        if token and len(token) <= MAX_TOKEN_CHARS:
            with self._store() as store:
                store.delete_session(token_digest(token))
