"""The queries of the dashboard's admin sessions and login attempts, and of the admin
credential checks' attempts (:mod:`prefixgate.admin_attempts`), shared by both backends
(mixed into :class:`~prefixgate.store.sql.SqlStore`). The policy (lifetimes, the
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

    def admin_attempt(
        self, attempt: str, address: str, now: float, *, window: float, per_address: int,
        in_all: int, trusted_since: float,
    ) -> float | None:  # fmt: skip
        """Count an admin credential check from ``address`` as a failure (``attempt``: its
        id; :meth:`admin_success` takes it back); or, past ``per_address`` failures from
        the address, or ``in_all`` from everywhere while the address gave the right key
        no later than ``trusted_since``, count nothing and return how many seconds until
        the oldest counted failure ages out. Serialised, so every worker and replica
        counts alike and exactly."""
        p = self.ph
        with self._transaction(exclusive=True) as cur:
            self._lock_table(cur, "admin_failures")
            cur.execute(f"DELETE FROM admin_failures WHERE at <= {p}", (now - window,))
            cur.execute(
                f"SELECT COUNT(*), MIN(at) FROM admin_failures WHERE address = {p}", (address,)
            )
            mine, oldest = cur.fetchone()
            if int(mine) >= per_address:
                return max(1.0, float(oldest) + window - now)
            cur.execute("SELECT COUNT(*), MIN(at) FROM admin_failures")
            every, first = cur.fetchone()
            if int(every) >= in_all:
                cur.execute(
                    f"SELECT 1 FROM admin_good WHERE address = {p} AND at > {p}",
                    (address, trusted_since),
                )
                if cur.fetchone() is None:
                    return max(1.0, float(first) + window - now)
            cur.execute(
                f"INSERT INTO admin_failures (id, address, at) VALUES ({p}, {p}, {p})",
                (attempt, address, now),
            )
            return None

    def admin_success(self, attempt: str, address: str, now: float, *, forget: float) -> None:
        """The check counted as ``attempt`` found the right key: it is no failure, and
        ``address`` is one where the admin key was right (kept ``forget`` seconds)."""
        p = self.ph
        with self._transaction(exclusive=True) as cur:
            cur.execute(f"DELETE FROM admin_failures WHERE id = {p}", (attempt,))
            cur.execute(f"DELETE FROM admin_good WHERE address = {p} OR at <= {p}",
                        (address, now - forget))  # fmt: skip
            cur.execute(f"INSERT INTO admin_good (address, at) VALUES ({p}, {p})", (address, now))
