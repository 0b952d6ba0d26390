"""Fixtures for the store suite: the same tests run on SQLite and on the real Postgres
server (127.0.0.1:5432, or $PREFIXGATE_TEST_PG). Postgres must be reachable: its tests
fail, never skip, when it is not."""

from __future__ import annotations

import os
import secrets
import urllib.parse
from collections.abc import Iterator

import psycopg
import pytest

from prefixgate.store import Store, open_store

ADMIN_DSN = os.environ.get("PREFIXGATE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def with_uri(dsn: str, *, dbname: str | None = None, **query: str) -> str:
    """A copy of a postgresql:// URI with another database and/or extra query params."""
    parts = urllib.parse.urlsplit(dsn)
    path = f"/{dbname}" if dbname is not None else parts.path
    q = urllib.parse.parse_qsl(parts.query) + list(query.items())
    return urllib.parse.urlunsplit(parts._replace(path=path, query=urllib.parse.urlencode(q)))


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A uniquely named database for this test session, dropped at the end."""
    name = f"prefixgate_test_{secrets.token_hex(6)}"
    with psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_uri(ADMIN_DSN, dbname=name)
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_schema_dsn(database_dsn: str) -> str:
    """A fresh, empty schema in the session database, as a DSN whose search_path is it."""
    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return with_uri(database_dsn, options=f"-csearch_path={schema}")


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
