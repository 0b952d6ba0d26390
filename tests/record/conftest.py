"""Fixtures for the record suite; Postgres comes from the store suite's fixtures."""

from __future__ import annotations

from tests.store.conftest import pg_database

__all__ = ["pg_database"]
