"""Where records go (``store:``): the database, the journal in front of it, and how long
a stalled store is waited for."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from prefixgate.config.common import Model


class StoreConfig(Model):
    dsn: str = "sqlite:///prefixgate.db"
    retention_days: float | None = None
    capture_segments: bool = True
    # Memory for the sessions' latest requests, which each request is compared with to
    # find what breaks its prefix (record/changes.py); 0 turns the comparison off. It
    # also lends each turn's capture its previous turn's pieces: with 0 every turn is cut
    # and hashed whole, about twice the gateway's CPU a turn (docs/performance.md).
    change_memory_mb: float = Field(64.0, ge=0)
    # The miss ledger of each request (ledger/: where its prompt tokens went), computed
    # after the request, off its path, into the ``ledgers`` table.
    ledger: bool = True
    # The record journal (record/journal.py): a directory where each record is appended as
    # its answer completes, until the store has it; each process writes its own slot in
    # it. null: no journal (records wait for the store in memory; a crash loses them).
    journal_path: str | None = "prefixgate-journal"
    # Past this size the journal takes no more records (logged) until the store catches up.
    journal_max_mb: float = Field(default=1024.0, gt=0)
    # A stalled store is a failed store: a statement fails after statement_timeout, a lock
    # wait after lock_timeout (SQLite: its busy timeout); the writer retries later while
    # records wait in the journal. Seconds.
    statement_timeout: float = Field(default=5.0, gt=0)
    lock_timeout: float = Field(default=2.0, gt=0)
    # Shutdown gives the store at most this long to take what is pending; the rest stays
    # in the journal for the next start. Seconds.
    close_timeout: float = Field(default=5.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, raw: object) -> object:
        if isinstance(raw, dict) and "spool_path" in raw:
            raise ValueError(
                "spool_path is gone: records go to a journal directory, store.journal_path"
            )
        return raw

    @field_validator("dsn")
    @classmethod
    def _known_store(cls, v: str) -> str:
        # What store.open_store takes; said at start rather than at the first record.
        if not v.startswith(("postgresql://", "postgres://", "sqlite:")) and not v.endswith(
            (".db", ".sqlite", ".sqlite3")
        ):
            raise ValueError("want sqlite:///path.db, a .db path, or postgresql://…")
        return v
