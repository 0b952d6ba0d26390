"""Fixtures for the store suite: the same tests run on SQLite and on the real Postgres
server (127.0.0.1:5432, or $PREFIXGATE_TEST_PG). Postgres must be reachable: its tests
fail, never skip, when it is not."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from prefixgate.store import Store, open_store
from tests.conftest import pg_database, pg_schema_dsn  # noqa: F401  (fixture re-export)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def dsn(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'records.db'}"
    return pg_schema_dsn(request.getfixturevalue("pg_database"))


@pytest.fixture
def store(dsn: str) -> Iterator[Store]:
    s = open_store(dsn)
    try:
        yield s
    finally:
        s.close()
