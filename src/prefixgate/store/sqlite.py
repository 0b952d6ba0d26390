"""The default store: one SQLite file (stdlib ``sqlite3``) in WAL mode.

One connection shared by the threads of one process (guarded by a lock); WAL lets other
processes (``prefixgate doctor``) read while the gateway writes. ``synchronous=NORMAL``:
a power cut may lose the last transactions but never corrupts the file.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from prefixgate.store.base import StoreDataError, StoreError
from prefixgate.store.sql import SqlStore

# A parameter that is not exactly an int, float or str (None, a bool) is offered to the
# module's adapters, and with none registered for its type, CPython 3.11 looks for
# ``__adapt__`` on the protocol's type: an AttributeError formatted and dropped, about 1,200
# instructions a parameter, ~50 of them a record and its ledger. Adapters that give the
# same values (None stays NULL, a bool its integer) are one dict lookup and a call in C.
_NOTHING: dict[None, None] = {}
sqlite3.register_adapter(type(None), cast(Callable[[None], None], _NOTHING.get))  # None
sqlite3.register_adapter(bool, int)


class SqliteStore(SqlStore):
    dialect = "sqlite"
    ph = "?"

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = 10_000) -> None:
        super().__init__()
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn: sqlite3.Connection | None = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None
            )
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite store: {exc}") from exc

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"

    @contextlib.contextmanager
    def _transaction(self, *, exclusive: bool = False) -> Iterator[Any]:
        with self._lock:
            if self._conn is None:
                raise StoreError("store is closed")
            cur = self._conn.cursor()
            try:
                cur.execute("BEGIN IMMEDIATE" if exclusive else "BEGIN")
                try:
                    yield cur
                except BaseException:
                    self._conn.rollback()
                    raise
                cur.execute("COMMIT")
            except sqlite3.Error as exc:
                if self._conn.in_transaction:
                    self._conn.rollback()
                data = isinstance(exc, sqlite3.DataError | sqlite3.IntegrityError)
                error = StoreDataError if data else StoreError
                raise error(f"SQLite store failed: {exc}") from exc
            except OverflowError as exc:  # an integer past 64 bits: the data, not the store
                raise StoreDataError(f"SQLite store failed: {exc}") from exc
            finally:
                cur.close()

    def _has_table(self, cur: Any, name: str) -> bool:
        cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
        return cur.fetchone() is not None

    def _lock_schema(self, cur: Any) -> None:
        pass  # BEGIN IMMEDIATE already holds the database's write lock

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
