"""The queries both backends share; each backend supplies a connection, a transaction and
its spelling of parameters (see :class:`SqlStore`'s abstract methods)."""

from __future__ import annotations

import abc
import contextlib
import json
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prefixgate.ledger.causes import Ledger
from prefixgate.record.journal import SegmentsJson
from prefixgate.record.record import Record
from prefixgate.store import lists, schema
from prefixgate.store.base import AuditRow, KeyRow, Store, StoreError
from prefixgate.store.sessions import SessionQueries

PAGE_SIZE = 1000
# Texts this process knows are stored (hash -> last_seen written); bounded, cleared on prune.
TEXT_CACHE_MAX = 200_000


class SqlStore(SessionQueries, Store):
    dialect: str  # "sqlite" | "postgres"
    ph: str  # parameter placeholder: "?" or "%s"

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._text_seen: dict[str, float] = {}
        cols = ", ".join(schema.COLUMNS)
        kinds = dict(
            schema.SCALAR_COLUMNS
            + schema.SEGMENT_COLUMNS
            + schema.COST_COLUMNS
            + schema.ADDED_COLUMNS
            + schema.DIAGNOSIS_COLUMNS
            + schema.ROOT_COLUMNS
        )
        values = ", ".join(self._param(kinds[c]) for c in schema.COLUMNS)
        self._insert_request = (
            f"INSERT INTO requests ({cols}) VALUES ({values}) ON CONFLICT (request_id) DO NOTHING"
        )
        p = self.ph
        self._insert_text = (
            f"INSERT INTO segment_texts (hash, last_seen, text) VALUES ({p}, {p}, {p})"
            " ON CONFLICT (hash) DO UPDATE SET last_seen = excluded.last_seen"
            f" WHERE segment_texts.last_seen < excluded.last_seen - {schema.LAST_SEEN_GRANULARITY}"
        )
        self._select_cols = ", ".join(self._column(c, kinds[c]) for c in schema.COLUMNS)
        ledger_cols = [name for name, _, _ in schema.LEDGER_COLUMNS]
        self._insert_ledger = (
            f"INSERT INTO ledgers ({', '.join(ledger_cols)})"
            f" VALUES ({', '.join([p] * len(ledger_cols))})"
            " ON CONFLICT (request_id) DO NOTHING"
        )
        self._select_ledger = f"SELECT {', '.join(ledger_cols)} FROM ledgers WHERE request_id = {p}"
        self._select_request = f"SELECT {self._select_cols} FROM requests WHERE request_id = {p}"

    # -- backend hooks ---------------------------------------------------------------
    @abc.abstractmethod
    def _transaction(self, *, exclusive: bool = False) -> contextlib.AbstractContextManager[Any]:
        """A context manager holding ``self._lock`` and a transaction; yields a cursor.
        Commits on success, rolls back on error, maps driver errors to StoreError.
        ``exclusive`` asks for the write lock up front (SQLite's BEGIN IMMEDIATE)."""

    @abc.abstractmethod
    def _lock_schema(self, cur: Any) -> None:
        """Serialise migrations between processes (inside the transaction)."""

    def _lock_table(self, cur: Any, table: str) -> None:
        """Hold ``table``'s write lock until the transaction ends (SQLite's exclusive
        transaction already holds the whole database's)."""

    def _param(self, kind: str) -> str:
        return self.ph

    def _column(self, name: str, kind: str) -> str:
        return name

    # -- schema ----------------------------------------------------------------------
    @abc.abstractmethod
    def _has_table(self, cur: Any, name: str) -> bool:
        """Whether the table exists (in the current schema)."""

    def schema_version(self) -> int:
        with self._transaction() as cur:
            return self._version(cur)

    def _version(self, cur: Any) -> int:
        if not self._has_table(cur, "schema_version"):
            return 0
        cur.execute("SELECT MAX(version) FROM schema_version")
        row = cur.fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def migrate(self, target: int | None = None) -> int:
        target = schema.LATEST_VERSION if target is None else target
        if not 0 <= target <= schema.LATEST_VERSION:
            raise ValueError(f"no schema version {target}")
        with self._transaction(exclusive=True) as cur:
            self._lock_schema(cur)
            cur.execute(schema.SCHEMA_VERSION_DDL.format(real=schema.TYPES[self.dialect]["real"]))
            version = self._version(cur)
            for v in range(version + 1, target + 1):
                for statement in schema.MIGRATIONS[v - 1](self.dialect):
                    cur.execute(statement)
                cur.execute(
                    f"INSERT INTO schema_version (version, applied_at) VALUES ({self.ph}, {self.ph})",
                    (v, time.time()),
                )
                version = v
            return version

    # -- writing ---------------------------------------------------------------------
    def _json(self, data: bytes) -> Any:
        """A JSON column's parameter from its encoded JSON (the text; Postgres: the bytes)."""
        return data.decode()

    def write_batch(
        self,
        records: list[Record],
        *,
        segments: list[SegmentsJson] | None = None,
        ledgers: list[Ledger] | None = None,
    ) -> None:
        if not records:
            if ledgers:
                self.write_ledgers(ledgers)
            return
        json = self._json
        if segments is None:
            rows = [schema.record_row(r, None, json) for r in records]
        else:
            rows = [schema.record_row(r, s, json) for r, s in zip(records, segments, strict=True)]
        texts = schema.batch_texts(records)
        seen = self._text_seen
        fresh = [  # texts this store may not hold yet, or whose last_seen is due a refresh
            (h, at, text)
            for h, (text, at) in texts.items()
            if seen.get(h, float("-inf")) < at - schema.LAST_SEEN_GRANULARITY
        ]
        with self._lock:
            with self._transaction(exclusive=True) as cur:
                cur.executemany(self._insert_request, rows)
                if fresh:
                    cur.executemany(self._insert_text, fresh)
                if ledgers:
                    cur.executemany(self._insert_ledger, [schema.ledger_row(x) for x in ledgers])
            if len(seen) + len(fresh) > TEXT_CACHE_MAX:
                seen.clear()
            for h, at, _ in fresh:
                seen[h] = at

    def write_ledgers(self, ledgers: list[Ledger]) -> None:
        if not ledgers:
            return
        rows = [schema.ledger_row(x) for x in ledgers]
        with self._transaction(exclusive=True) as cur:
            cur.executemany(self._insert_ledger, rows)

    def get_ledger(self, request_id: str) -> Ledger | None:
        with self._transaction() as cur:
            cur.execute(self._select_ledger, (request_id,))
            row = cur.fetchone()
        return None if row is None else schema.row_ledger(row)

    # -- reading ---------------------------------------------------------------------
    def get_record(self, request_id: str) -> Record | None:
        with self._transaction() as cur:
            cur.execute(self._select_request, (request_id,))
            row = cur.fetchone()
        if row is None:
            return None
        record = schema.row_record(row)[0]
        lists.whole_records(self, [record])
        return record

    def count(self) -> int:
        with self._transaction() as cur:
            cur.execute("SELECT COUNT(*) FROM requests")
            return int(cur.fetchone()[0])

    def iter_records(
        self,
        since: float | None = None,
        until: float | None = None,
        *,
        with_texts: bool = False,
    ) -> Iterator[Record]:
        # Keyset pages, each its own short query: no cursor or lock outlives a page, so a
        # slow consumer never blocks the writer.
        p = self.ph
        where, params = [], []
        if since is not None:
            where.append(f"received_at >= {p}")
            params.append(since)
        if until is not None:
            where.append(f"received_at < {p}")
            params.append(until)
        last: tuple[float, int] | None = None
        while True:
            clauses = list(where)
            page_params: list[Any] = list(params)
            if last is not None:
                clauses.append(f"(received_at, id) > ({p}, {p})")
                page_params += [last[0], last[1]]
            sql = f"SELECT id, {self._select_cols} FROM requests"
            if clauses:
                sql += " WHERE " + " AND ".join(clauses)
            sql += f" ORDER BY received_at, id LIMIT {PAGE_SIZE}"
            with self._transaction() as cur:
                cur.execute(sql, page_params)
                rows = cur.fetchall()
            page = [schema.row_record(row[1:]) for row in rows]
            lists.whole_records(self, [record for record, _ in page])
            for record, captured in page:
                if with_texts and captured:
                    record.texts = self.get_texts(schema.segment_hashes(record))
                yield record
            if len(rows) < PAGE_SIZE:
                return
            last = (rows[-1][1 + schema.COLUMNS.index("received_at")], rows[-1][0])

    def get_texts(self, hashes: Iterable[str]) -> dict[str, str]:
        wanted = list(dict.fromkeys(hashes))
        out: dict[str, str] = {}
        with self._transaction() as cur:
            for chunk in _chunks(wanted, 500):
                marks = ", ".join([self.ph] * len(chunk))
                cur.execute(f"SELECT hash, text FROM segment_texts WHERE hash IN ({marks})", chunk)
                out.update(cur.fetchall())
        return out

    # -- analysis --------------------------------------------------------------------
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self.ph != "?":
            sql = sql.replace("?", self.ph)
        with self._transaction() as cur:
            cur.execute(sql, list(params))
            return [tuple(row) for row in cur.fetchall()]

    # -- API keys --------------------------------------------------------------------
    def create_key(
        self,
        name: str,
        owner: str | None,
        digest: str,
        models: Iterable[str],
        budgets: Iterable[str] = (),
    ) -> KeyRow:
        row = KeyRow(name, owner, digest, tuple(models), time.time(), budgets=tuple(budgets))
        p = self.ph
        with self._transaction(exclusive=True) as cur:
            cur.execute(
                f"SELECT name FROM api_keys WHERE name = {p} OR digest = {p}", (name, digest)
            )
            if cur.fetchone() is not None:
                raise StoreError(f"a key named {name!r} (or with that digest) exists already")
            cur.execute(
                "INSERT INTO api_keys (name, owner, digest, models, created_at, revoked_at,"
                f" budgets) VALUES ({p}, {p}, {p}, {p}, {p}, NULL, {p})",
                (
                    name,
                    owner,
                    digest,
                    json.dumps(list(row.models)),
                    row.created_at,
                    json.dumps(list(row.budgets)),
                ),
            )
        return row

    def set_key_budgets(self, name: str, budgets: Iterable[str]) -> bool:
        p = self.ph
        with self._transaction(exclusive=True) as cur:
            cur.execute(
                f"UPDATE api_keys SET budgets = {p} WHERE name = {p} AND revoked_at IS NULL",
                (json.dumps(list(budgets)), name),
            )
            return bool(cur.rowcount > 0)

    def list_keys(self) -> list[KeyRow]:
        with self._transaction() as cur:
            cur.execute(
                "SELECT name, owner, digest, models, created_at, revoked_at, budgets"
                " FROM api_keys ORDER BY name"
            )
            return [_key_row(r) for r in cur.fetchall()]

    def revoke_key(self, name: str) -> bool:
        p = self.ph
        with self._transaction(exclusive=True) as cur:
            cur.execute(
                f"UPDATE api_keys SET revoked_at = {p} WHERE name = {p} AND revoked_at IS NULL",
                (time.time(), name),
            )
            return bool(cur.rowcount > 0)

    def rotate_key(self, name: str, digest: str) -> bool:
        p = self.ph
        with self._transaction(exclusive=True) as cur:
            cur.execute(
                f"UPDATE api_keys SET digest = {p} WHERE name = {p} AND revoked_at IS NULL",
                (digest, name),
            )
            return bool(cur.rowcount > 0)

    def set_owner_budgets(self, owner: str, budgets: Iterable[str]) -> None:
        lines = list(budgets)
        p = self.ph
        with self._transaction(exclusive=True) as cur:
            cur.execute(f"DELETE FROM owner_budgets WHERE owner = {p}", (owner,))
            if lines:
                cur.execute(
                    f"INSERT INTO owner_budgets (owner, budgets, at) VALUES ({p}, {p}, {p})",
                    (owner, json.dumps(lines), time.time()),
                )

    def list_owner_budgets(self) -> dict[str, tuple[str, ...]]:
        with self._transaction() as cur:
            cur.execute("SELECT owner, budgets FROM owner_budgets ORDER BY owner")
            return {owner: tuple(json.loads(lines)) for owner, lines in cur.fetchall()}

    # -- the console's audit log -----------------------------------------------------------
    def add_audit(self, actor: str, action: str, target: str, detail: str = "") -> None:
        p = self.ph
        with self._transaction() as cur:
            cur.execute(
                f"INSERT INTO audit_log (at, actor, action, target, detail)"
                f" VALUES ({p}, {p}, {p}, {p}, {p})",
                (time.time(), actor, action, target, detail),
            )

    def list_audit(self, limit: int = 200) -> list[AuditRow]:
        with self._transaction() as cur:
            cur.execute(
                "SELECT at, actor, action, target, detail FROM audit_log"
                f" ORDER BY at DESC LIMIT {int(limit)}"
            )
            return [AuditRow(*row) for row in cur.fetchall()]

    # -- retention -------------------------------------------------------------------
    def prune(self, older_than_seconds: float, *, now: float | None = None) -> int:
        cutoff = (time.time() if now is None else now) - older_than_seconds
        p = self.ph
        with self._transaction() as cur:
            # A record kept may be stored as a difference to an older root (store/lists.py):
            # the root stays while any record kept builds on it.
            cur.execute(
                f"DELETE FROM requests WHERE received_at < {p} AND request_id NOT IN"
                " (SELECT segments_root FROM requests"
                f" WHERE received_at >= {p} AND segments_root IS NOT NULL)",
                (cutoff, cutoff),
            )
            deleted = cur.rowcount
            if self._has_table(cur, "ledgers"):
                cur.execute(f"DELETE FROM ledgers WHERE request_at < {p}", (cutoff,))
            # A request kept (received_at >= cutoff) refreshed its texts' last_seen to at
            # least received_at - granularity, so these texts are referenced by no one left.
            cur.execute(
                f"DELETE FROM segment_texts WHERE last_seen < {p}",
                (cutoff - schema.LAST_SEEN_GRANULARITY,),
            )
        self._text_seen.clear()
        return int(max(deleted, 0))


def _key_row(row: Sequence[Any]) -> KeyRow:
    name, owner, digest, models, created_at, revoked_at, budgets = row
    return KeyRow(
        name,
        owner,
        digest,
        tuple(json.loads(models)),
        created_at,
        revoked_at,
        tuple(json.loads(budgets or "[]")),
    )


def _chunks(items: Sequence[str], n: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]
