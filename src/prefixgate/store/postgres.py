"""The store at scale: PostgreSQL through psycopg 3 (synchronous; the writer runs it in a
thread). Several gateway replicas may write to one database; migrations are serialised
with an advisory lock. The connection is opened lazily and reopened after a failure, so a
store built while the server is down starts working once it is back.

A statement and lock timeout, when given, are set on each session: a table locked by
someone else, or a server that stopped answering queries, then fails the statement after
that long instead of holding the calling thread without end.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from prefixgate.store.base import StoreDataError, StoreError
from prefixgate.store.sql import SqlStore

# pg_advisory_xact_lock key for migrations ("pgat").
_MIGRATION_LOCK = 0x70676174


class PostgresStore(SqlStore):
    dialect = "postgres"
    ph = "%s"

    def __init__(
        self,
        dsn: str,
        *,
        connect_timeout: int = 5,
        statement_timeout: float | None = None,
        lock_timeout: float | None = None,
    ) -> None:
        super().__init__()
        self._dsn = dsn  # may hold a password: never printed
        self._connect_timeout = connect_timeout
        # Session settings (name, value in ms), set on each new connection.
        self._session = [
            (name, str(max(1, round(seconds * 1000))))
            for name, seconds in (
                ("statement_timeout", statement_timeout),
                ("lock_timeout", lock_timeout),
            )
            if seconds is not None
        ]
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return "PostgresStore(<dsn hidden>)"

    def _param(self, kind: str) -> str:
        return "%s::jsonb" if kind == "json" else "%s"

    def _json(self, data: bytes) -> Any:
        # The encoded JSON handed to the driver as it is: no text made of it, none
        # encoded back to bytes for the wire.
        return Jsonb(data, dumps=_as_is)

    def _column(self, name: str, kind: str) -> str:
        return f"{name}::text" if kind == "json" else name

    def _connection(self) -> psycopg.Connection[Any]:
        if self._closed:
            raise StoreError("store is closed")
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            self._conn = conn = None
            try:
                conn = psycopg.connect(
                    self._dsn, autocommit=True, connect_timeout=self._connect_timeout
                )
                if self._session:
                    calls = ", ".join(["set_config(%s, %s, false)"] * len(self._session))
                    conn.execute(f"SELECT {calls}", [v for pair in self._session for v in pair])
            except psycopg.Error as exc:
                if conn is not None:
                    conn.close()
                # libpq's message names host and port, never the password.
                raise StoreError(f"cannot connect to Postgres store: {_first_line(exc)}") from exc
            self._conn = conn
        return conn

    @contextlib.contextmanager
    def _transaction(self, *, exclusive: bool = False) -> Iterator[Any]:
        with self._lock:
            conn = self._connection()
            try:
                with conn.transaction(), conn.cursor() as cur:
                    yield cur
            except psycopg.Error as exc:
                if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
                    conn.close()
                error = (
                    StoreDataError
                    if isinstance(exc, psycopg.DataError | psycopg.IntegrityError)
                    else StoreError
                )
                raise error(f"Postgres store failed: {_first_line(exc)}") from exc

    def _has_table(self, cur: Any, name: str) -> bool:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (name,))
        return bool(cur.fetchone()[0])

    def _lock_schema(self, cur: Any) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))

    def _lock_table(self, cur: Any, table: str) -> None:
        cur.execute(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _as_is(data: Any) -> Any:
    return data


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
