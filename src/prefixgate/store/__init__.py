"""Schema and queries for the request record: SQLite by default, Postgres at scale."""

from prefixgate.store.base import Store, StoreDataError, StoreError, open_store

__all__ = ["Store", "StoreDataError", "StoreError", "open_store"]
