"""What a dashboard view looks at: a time window and equality filters, read from the query
string once and turned into portable SQL (``?`` placeholders) for :mod:`.queries`."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from prefixgate.doctor.timespec import parse_time

# Filter name in the query string -> column of ``requests``.
FILTERS: dict[str, str] = {
    "endpoint": "endpoint",
    "key": "key_name",
    "client": "client",
    "channel": "channel",
    "model": "requested_model",
    "session": "session_id",
    "kind": "session_kind",
    "replica": "replica",
}
# Dimensions a chart can be split by: name -> column.
DIMENSIONS: dict[str, str] = {
    "endpoint": "endpoint",
    "client": "client",
    "channel": "channel",
    "model": "requested_model",
    "key": "key_name",
    "kind": "session_kind",
}
NONE = "(none)"  # how a NULL value is shown and asked for
DEFAULT_SINCE = "24h"

# Successful requests with a prompt: the only ones a hit rate is made of.
OK = "(status >= 200 AND status < 300 AND prompt_tokens > 0)"
ERROR = "(status < 200 OR status >= 300)"


class BadParam(ValueError):
    """A query parameter the dashboard cannot read (answered with 400)."""


@dataclass(frozen=True)
class Scope:
    since: float | None
    until: float | None
    filters: tuple[tuple[str, str | None], ...] = ()  # (column, value); None is NULL

    def where(self) -> tuple[str, list[float | str]]:
        """``AND``-able clauses (leading space) and their parameters."""
        sql = ""
        params: list[float | str] = []
        if self.since is not None:
            sql += " AND received_at >= ?"
            params.append(self.since)
        if self.until is not None:
            sql += " AND received_at < ?"
            params.append(self.until)
        for column, value in self.filters:
            if value is None:
                sql += f" AND {column} IS NULL"
            else:
                sql += f" AND {column} = ?"
                params.append(value)
        return sql, params

    def pairs(self) -> list[tuple[str, str | None]]:
        return list(self.filters)

    def narrowed(self, column: str, value: str | None) -> Scope:
        return Scope(self.since, self.until, (*self.filters, (column, value)))


def _time(params: Mapping[str, str], name: str, default: str | None, now: float) -> float | None:
    raw = params.get(name, default)
    if raw is None or raw.strip() in ("", "all"):
        return None
    try:
        return parse_time(raw, now=now)
    except ValueError as exc:
        raise BadParam(str(exc)) from None


def scope_of(params: Mapping[str, str], *, now: float | None = None) -> Scope:
    """The scope named by a query string: ``since`` (default 24h; ``all`` for no bound),
    ``until``, and any of :data:`FILTERS` (``(none)`` asks for NULL)."""
    now = time.time() if now is None else now
    since = _time(params, "since", DEFAULT_SINCE, now)
    until = _time(params, "until", None, now)
    filters = []
    for name, column in FILTERS.items():
        value = params.get(name)
        if value:
            filters.append((column, None if value == NONE else value))
    return Scope(since, until, tuple(filters))


def dimension_of(params: Mapping[str, str], default: str = "endpoint") -> tuple[str, str]:
    """The ``by`` parameter: (name, column) of the dimension to split by."""
    name = params.get("by") or default
    column = DIMENSIONS.get(name)
    if column is None:
        raise BadParam(f"cannot split by {name!r}: want one of {', '.join(DIMENSIONS)}")
    return name, column
