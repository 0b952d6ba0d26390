"""The queries of the dashboard's admin sessions and login attempts, shared by both
backends (mixed into :class:`~prefixgate.store.sql.SqlStore`). The policy (lifetimes, the
admin key's fingerprint, the token) lives in ``web/login.py``; these only keep rows."""

from __future__ import annotations

from typing import Any

from prefixgate.store.base import SessionRow

_COLUMNS = "digest, admin, created_at, last_seen, expires_at"


class SessionQueries:
    ph: str
    _transaction: Any  # SqlStore's
    _lock_table: Any

    def create_session(self, row: SessionRow) -> None:
        p = self.ph
        with self._transaction(exclusive=True) as cur:
            cur.execute(
                f"INSERT INTO dashboard_sessions ({_COLUMNS}) VALUES ({p}, {p}, {p}, {p}, {p})",
                (row.digest, row.admin, row.created_at, row.last_seen, row.expires_at),
            )

    def get_session(self, digest: str) -> SessionRow | None:
        with self._transaction() as cur:
            cur.execute(
                f"SELECT {_COLUMNS} FROM dashboard_sessions WHERE digest = {self.ph}", (digest,)
            )
            row = cur.fetchone()
        return None if row is None else SessionRow(*row)

    def touch_session(self, digest: str, now: float) -> None:
        p = self.ph
        with self._transaction() as cur:
            cur.execute(
                f"UPDATE dashboard_sessions SET last_seen = {p}"
                f" WHERE digest = {p} AND last_seen < {p}",
                (now, digest, now),
            )

    def delete_session(self, digest: str) -> bool:
        with self._transaction() as cur:
            cur.execute(f"DELETE FROM dashboard_sessions WHERE digest = {self.ph}", (digest,))
            return bool(cur.rowcount > 0)

    def prune_sessions(self, now: float, idle: float) -> int:
        p = self.ph
        with self._transaction() as cur:
            cur.execute(
                f"DELETE FROM dashboard_sessions WHERE expires_at <= {p} OR last_seen <= {p}",
                (now, now - idle),
            )
            return int(max(cur.rowcount, 0))

    def login_attempt(self, address: str, now: float, *, window: float, limit: int) -> bool:
        # Attempts are serialised (the table's write lock), so a burst of parallel
        # attempts, from any worker or replica, is counted exactly.
        p = self.ph
        with self._transaction(exclusive=True) as cur:
            self._lock_table(cur, "dashboard_logins")
            cur.execute(f"DELETE FROM dashboard_logins WHERE at <= {p}", (now - window,))
            cur.execute(f"SELECT COUNT(*) FROM dashboard_logins WHERE address = {p}", (address,))
            if int(cur.fetchone()[0]) >= limit:
                return False
            cur.execute(
                f"INSERT INTO dashboard_logins (address, at) VALUES ({p}, {p})", (address, now)
            )
            return True
