"""Read-only SQL against a store, one text for SQLite and Postgres.

The doctor's aggregations run inside the database. Statements are written with ``?``
placeholders and only portable SQL (``CASE``, ``COALESCE``, ``CAST … AS BIGINT``,
``GROUP BY`` on select positions); :func:`run` swaps in the backend's placeholder and
executes through the store's own transaction (its lock, its error mapping to
:class:`~prefixgate.store.StoreError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefixgate.store import Store

# Successful requests with a prompt: the only ones a hit rate is made of.
OK = "status >= 200 AND status < 300 AND prompt_tokens > 0"

# floor(received_at / 86400) in both dialects: SQLite's CAST truncates, Postgres's rounds,
# so subtract one where the cast went above the true quotient.
DAY = (
    "(CAST(received_at / 86400 AS BIGINT)"
    " - CASE WHEN CAST(received_at / 86400 AS BIGINT) > received_at / 86400 THEN 1 ELSE 0 END)"
)


def run(store: Store, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Execute one read-only statement (``?`` placeholders) on ``store``; all rows."""
    return store.query(sql, params)


def window(since: float | None, until: float | None) -> tuple[str, list[Any]]:
    """``AND``-able clause (with a leading space) and params for a time window."""
    sql, params = "", []
    if since is not None:
        sql += " AND received_at >= ?"
        params.append(since)
    if until is not None:
        sql += " AND received_at < ?"
        params.append(until)
    return sql, params


def equals(column: str, value: Any) -> tuple[str, list[Any]]:
    """``AND``-able equality on a (trusted) column name; NULL compares as IS NULL."""
    if value is None:
        return f" AND {column} IS NULL", []
    return f" AND {column} = ?", [value]
