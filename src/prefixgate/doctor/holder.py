"""The doctor for one key holder: the records it reads are that key's, and no other's.

:class:`HolderRecords` stands in for the store the diagnosis reads: every statement runs
with ``requests`` and ``ledgers`` bound (common table expressions put in front of it) to
the rows of one key received since a time, so each finding the records make — breakers,
slices and their segments, ``template_hoisting`` and ``template_reasoning``, capacity and
routing, failures, usage semantics — is computed from the holder's own requests only,
whatever query the finding runs. Segment texts are read by the hashes those rows carry.
Nothing else of the store is reachable through it: a statement that names another table
is refused, so a finding added later that reads elsewhere fails here instead of showing
someone else's figures. Findings from the upstreams' own metrics or logs are the
admin's: the holder's diagnosis is given none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from prefixgate.store import Store, StoreError

# The tables a diagnosis of records reads; each is the holder's own through the prefix.
_TABLES = {"requests", "ledgers"}
_NAMED = re.compile(r"\b(?:FROM|JOIN)\s+([A-Za-z_][A-Za-z0-9_.]*)", re.I)


class HolderRecords:
    """What the doctor reads of ``store``, restricted to the records of the key named
    ``key_name`` received at or after ``since``."""

    def __init__(self, store: Store, key_name: str, since: float) -> None:
        self._store = store
        main = "main." if getattr(store, "dialect", "") == "sqlite" else ""
        # A common table expression hides the table of its name from the statement; in
        # SQLite its own body needs the schema's name (Postgres reads the table there).
        self._prefix = (
            f"requests AS (SELECT * FROM {main}requests WHERE key_name = ? AND received_at >= ?),"
            f" ledgers AS (SELECT * FROM {main}ledgers"
            " WHERE request_id IN (SELECT request_id FROM requests))"
        )
        self._params = [key_name, since]

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        for name in _NAMED.findall(sql):
            if name.lower() not in _TABLES:
                raise StoreError(f"a key holder's diagnosis reads no table {name!r}")
        head = sql.lstrip()
        if head[:5].upper() == "WITH ":
            statement = f"WITH {self._prefix}, {head[5:]}"
        else:
            statement = f"WITH {self._prefix} {sql}"
        return self._store.query(statement, [*self._params, *params])

    def schema_version(self) -> int:
        return self._store.schema_version()

    def get_texts(self, hashes: Iterable[str]) -> dict[str, str]:
        """Texts by hash: only those of segments the holder's records carry reach here."""
        return self._store.get_texts(hashes)


__all__ = ["HolderRecords"]
