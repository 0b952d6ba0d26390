"""The store interface, its one error type, and :func:`open_store`.

A store keeps :class:`~prefixgate.record.record.Record` rows and the content-addressed
segment texts (see :mod:`prefixgate.store.schema`). Every method is synchronous and
thread-safe; the async writer calls them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prefixgate.ledger.causes import Ledger
from prefixgate.record.record import Record

if TYPE_CHECKING:
    from prefixgate.record.journal import SegmentsJson


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One change made through the console: when, by whom, what, to which key or owner."""

    at: float
    actor: str
    action: str
    target: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class KeyRow:
    """An API key kept in the store: its digest, never the key."""

    name: str
    owner: str | None
    digest: str
    models: tuple[str, ...]
    created_at: float
    revoked_at: float | None = None
    budgets: tuple[str, ...] = ()  # as written: "50 USD/month" (spend/budgets.py)

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True, slots=True)
class SessionRow:
    """A dashboard admin session: the digest of its token, never the token; ``admin`` is a
    fingerprint of the admin key it was opened with (a rotated key ends the session)."""

    digest: str
    admin: str
    created_at: float
    last_seen: float
    expires_at: float


class StoreError(Exception):
    """The store failed (unreachable, full, corrupt). Never carries a DSN or a password."""


class StoreDataError(StoreError):
    """The store refused the data itself (a value its types cannot hold, say a NUL
    character in a Postgres text): trying again later would fail the same way."""


class Store(abc.ABC):
    """Where records go. Implementations: SQLite (default) and Postgres."""

    @abc.abstractmethod
    def migrate(self, target: int | None = None) -> int:
        """Apply forward migrations up to ``target`` (default: the latest); return the
        schema version now in place. Idempotent, safe to call from several processes."""

    @abc.abstractmethod
    def schema_version(self) -> int:
        """The applied schema version, 0 for an empty database."""

    @abc.abstractmethod
    def write_batch(
        self,
        records: list[Record],
        *,
        segments: list[SegmentsJson] | None = None,
        ledgers: list[Ledger] | None = None,
    ) -> None:
        """Write records and their texts in one transaction. Idempotent per
        ``request_id``: writing a record again stores nothing new. ``segments``: each
        record's segment lists already encoded (the journal's), so they are not again;
        ``ledgers``: miss ledgers written in the same transaction (as ``write_ledgers``)."""

    def write_ledgers(self, ledgers: list[Ledger]) -> None:
        """Write miss ledgers (:mod:`prefixgate.ledger`) in one transaction; a request's
        ledger written again stores nothing new."""
        raise NotImplementedError(f"{type(self).__name__} has no ledgers")

    def get_ledger(self, request_id: str) -> Ledger | None:
        """The miss ledger of a request, or None."""
        raise NotImplementedError(f"{type(self).__name__} has no ledgers")

    def get_record(self, request_id: str) -> Record | None:
        """The record of a request, by its id, with its segments; or None."""
        raise NotImplementedError(f"{type(self).__name__} cannot look a record up")

    @abc.abstractmethod
    def count(self) -> int:
        """Number of stored records."""

    @abc.abstractmethod
    def iter_records(
        self,
        since: float | None = None,
        until: float | None = None,
        *,
        with_texts: bool = False,
    ) -> Iterator[Record]:
        """Records with ``since <= received_at < until``, oldest first, with their segments.
        With ``with_texts``, captured records also carry the stored texts of their segments."""

    @abc.abstractmethod
    def get_texts(self, hashes: Iterable[str]) -> dict[str, str]:
        """Stored texts of the given segment hashes (missing ones are left out)."""

    @abc.abstractmethod
    def prune(self, older_than_seconds: float, *, now: float | None = None) -> int:
        """Delete records received more than ``older_than_seconds`` ago, and texts no
        request has carried since then; return the number of records deleted."""

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one read-only analysis statement, written in portable SQL with ``?``
        placeholders, inside the database; return every row (the doctor's aggregations)."""
        raise NotImplementedError(f"{type(self).__name__} has no query")

    def create_key(
        self,
        name: str,
        owner: str | None,
        digest: str,
        models: Iterable[str],
        budgets: Iterable[str] = (),
    ) -> KeyRow:
        """Add an API key by its digest; StoreError if the name or digest exists."""
        raise NotImplementedError(f"{type(self).__name__} has no create_key")

    def set_key_budgets(self, name: str, budgets: Iterable[str]) -> bool:
        """Replace an active key's budgets; False when there is no active key of that name."""
        raise NotImplementedError(f"{type(self).__name__} has no set_key_budgets")

    def list_keys(self) -> list[KeyRow]:
        """Every key, revoked ones included, by name."""
        raise NotImplementedError(f"{type(self).__name__} has no list_keys")

    def revoke_key(self, name: str) -> bool:
        """Revoke the named key; False when there is no active key of that name."""
        raise NotImplementedError(f"{type(self).__name__} has no revoke_key")

    def rotate_key(self, name: str, digest: str) -> bool:
        """Give the named active key a new digest (the old key stops working); False when
        there is no active key of that name."""
        raise NotImplementedError(f"{type(self).__name__} has no rotate_key")

    def set_owner_budgets(self, owner: str, budgets: Iterable[str]) -> None:
        """Give ``owner`` these budgets (none: the owner has no budget of the store's, the
        config's apply again)."""
        raise NotImplementedError(f"{type(self).__name__} has no owner budgets")

    def list_owner_budgets(self) -> dict[str, tuple[str, ...]]:
        """Every owner given budgets in the store: owner -> budget lines."""
        raise NotImplementedError(f"{type(self).__name__} has no owner budgets")

    def add_audit(self, actor: str, action: str, target: str, detail: str = "") -> None:
        """Append one entry to the audit log (never a secret in it)."""
        raise NotImplementedError(f"{type(self).__name__} has no audit log")

    def list_audit(self, limit: int = 200) -> list[AuditRow]:
        """The latest entries of the audit log, newest first."""
        raise NotImplementedError(f"{type(self).__name__} has no audit log")

    def create_session(self, row: SessionRow) -> None:
        """Keep a new dashboard session."""
        raise NotImplementedError(f"{type(self).__name__} has no sessions")

    def get_session(self, digest: str) -> SessionRow | None:
        """The session whose token has this digest, or None."""
        raise NotImplementedError(f"{type(self).__name__} has no sessions")

    def touch_session(self, digest: str, now: float) -> None:
        """Note activity on a session (its idle lifetime starts again)."""
        raise NotImplementedError(f"{type(self).__name__} has no sessions")

    def delete_session(self, digest: str) -> bool:
        """End a session; False when there was none."""
        raise NotImplementedError(f"{type(self).__name__} has no sessions")

    def prune_sessions(self, now: float, idle: float) -> int:
        """Delete sessions past their absolute expiry or idle for ``idle`` seconds."""
        raise NotImplementedError(f"{type(self).__name__} has no sessions")

    def login_attempt(self, address: str, now: float, *, window: float, limit: int) -> bool:
        """Count a login attempt from ``address``; False (and nothing counted) when it
        already made ``limit`` attempts in the last ``window`` seconds."""
        raise NotImplementedError(f"{type(self).__name__} has no sessions")

    def admin_attempt(
        self, attempt: str, address: str, now: float, *, window: float, per_address: int,
        in_all: int, trusted_since: float,
    ) -> float | None:  # fmt: skip
        """Count an admin credential check as a failure until it proves right; or, past
        the bounds, count nothing and return the seconds to wait (admin_attempts.py)."""
        raise NotImplementedError(f"{type(self).__name__} has no admin attempts")

    def admin_success(self, attempt: str, address: str, now: float, *, forget: float) -> None:
        """The check counted as ``attempt`` found the right key (admin_attempts.py)."""
        raise NotImplementedError(f"{type(self).__name__} has no admin attempts")

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections. The store may not be used afterwards."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


def open_store(
    dsn: str, *, statement_timeout: float | None = None, lock_timeout: float | None = None
) -> Store:
    """Open (without migrating) the store named by ``dsn``.

    - ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``, or a bare path ending
      in ``.db``/``.sqlite``/``.sqlite3``;
    - ``sqlite://:memory:`` (or ``sqlite:///:memory:``) for a private in-memory database;
    - ``postgresql://…`` / ``postgres://…``: any libpq connection URI.

    ``statement_timeout`` and ``lock_timeout`` (seconds) bound how long one statement may
    run and wait for a lock, so that a stalled store fails instead of hanging its caller
    (the record writer: its records then wait in the journal). Postgres sets both on each
    session; SQLite has no statement timeout and takes ``lock_timeout`` as its busy
    timeout (10 s when not given).
    """
    if dsn.startswith(("postgresql://", "postgres://")):
        from prefixgate.store.postgres import PostgresStore

        return PostgresStore(dsn, statement_timeout=statement_timeout, lock_timeout=lock_timeout)
    busy_ms = 10_000 if lock_timeout is None else int(lock_timeout * 1000)
    if dsn.startswith("sqlite:"):
        rest = dsn.removeprefix("sqlite:")
        if rest in ("//:memory:", "///:memory:", ":memory:"):
            path = ":memory:"
        elif rest.startswith("///"):
            path = rest[3:]
        else:
            raise StoreError("sqlite DSN must look like sqlite:///path/to.db or sqlite://:memory:")
        if not path:
            raise StoreError("sqlite DSN has no path")
        from prefixgate.store.sqlite import SqliteStore

        return SqliteStore(path, busy_timeout_ms=busy_ms)
    if dsn.endswith(SQLITE_SUFFIXES):
        from prefixgate.store.sqlite import SqliteStore

        return SqliteStore(dsn, busy_timeout_ms=busy_ms)
    raise StoreError("unknown store DSN scheme (want sqlite:///…, a .db path or postgresql://…)")
