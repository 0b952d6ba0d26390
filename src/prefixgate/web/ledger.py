"""The miss ledger as the dashboard shows it: one request's ledger (its page and
``ledger`` in ``/dashboard/api/requests/{request_id}``), and the prompt tokens of a window
by cause over time (the overview's chart). Ledgers are read from their own table; the
view's filters select the requests (portable SQL, inside the database)."""

from __future__ import annotations

from typing import Any

from prefixgate.ledger import CAUSES
from prefixgate.store import Store
from prefixgate.store.schema import LEDGER_VERSION
from prefixgate.web.queries import as_int, bucket_floor
from prefixgate.web.scope import Scope

_SUMS = ", ".join(f"SUM(tokens_{c})" for c in CAUSES)


def has_ledgers(store: Store) -> bool:
    return store.schema_version() >= LEDGER_VERSION


def detail(store: Store, request_id: str) -> dict[str, Any] | None:
    """A request's ledger as plain data, with ``parts`` (the causes) and ``agree`` (each
    prediction of the hit against the engine's figure); None when it has none (yet)."""
    if not has_ledgers(store):
        return None
    ledger = store.get_ledger(request_id)
    if ledger is None:
        return None
    out = ledger.as_dict()
    out.pop("received_at", None)
    engine = ledger.engine_cached
    out["agree"] = {
        name: None if engine is None or value is None else value == engine
        for name, value in (("index", ledger.index_predicted), ("model", ledger.model_predicted))
    }
    return out


def _selected(scope: Scope) -> tuple[str, list[Any]]:
    where, params = scope.where()
    return f"request_id IN (SELECT request_id FROM requests WHERE 1 = 1{where})", params


def series(store: Store, scope: Scope, axis: dict[str, Any] | None) -> dict[str, Any] | None:
    """Totals by cause and source in the window, and per bucket of the overview's time
    axis (``axis``: its ``origin``, ``width``, ``buckets``) the tokens of each cause."""
    if axis is None or not has_ledgers(store):
        return None
    sel, params = _selected(scope)
    rows = store.query(
        f"SELECT source, COUNT(*), {_SUMS} FROM ledgers WHERE {sel} GROUP BY source", params
    )
    if not rows:
        return None
    totals = dict.fromkeys(CAUSES, 0)
    sources: dict[str, int] = {}
    for row in rows:
        sources[str(row[0])] = as_int(row[1])
        for c, v in zip(CAUSES, row[2:], strict=True):
            totals[c] += as_int(v)
    origin, width, n = axis["origin"], axis["width"], axis["buckets"]
    bucket = bucket_floor("((request_at - ?) / ?)")
    rows = store.query(
        f"SELECT {bucket}, {_SUMS} FROM ledgers WHERE {sel} GROUP BY 1",
        [float(origin), float(width)] * 3 + params,
    )
    causes = {c: [0] * n for c in CAUSES}
    for row in rows:
        b = as_int(row[0])
        if 0 <= b < n:
            for c, v in zip(CAUSES, row[1:], strict=True):
                causes[c][b] += as_int(v)
    return {"totals": totals, "sources": sources, "causes": causes}
