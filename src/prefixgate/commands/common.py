"""Helpers shared by the subcommands: the config and the store they act on."""

from __future__ import annotations

import logging
import sys

import click

from prefixgate.config import ConfigError, load_config


def setup_logging(level: str) -> None:
    """Log lines on stderr at ``level`` (a command's --log-level)."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


_store_opts = [
    click.option(
        "--store", "store_dsn", default=None, help="Store DSN (default sqlite:///prefixgate.db)."
    ),
    click.option(
        "--config",
        "config_path",
        type=click.Path(exists=True, dir_okay=False),
        help="Take the store (and the price table) from this config.",
    ),
]


def with_store(f):
    """The ``--store`` and ``--config`` options of a command that reads the store."""
    for opt in reversed(_store_opts):
        f = opt(f)
    return f


def config_of(config_path: str | None):
    if not config_path:
        return None
    try:
        return load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def store_dsn_of(store_dsn: str | None, config) -> str:
    """--store, else the config's store, else the default SQLite file."""
    if store_dsn is None and config is not None:
        if config.store is None:
            raise click.ClickException("the config has no store")
        store_dsn = config.store.dsn
    return store_dsn or "sqlite:///prefixgate.db"


def require_sqlite_file(dsn: str) -> None:
    from pathlib import Path

    if dsn.startswith("sqlite:///") and ":memory:" not in dsn:
        path = Path(dsn.removeprefix("sqlite:///"))
        if not path.exists():
            raise click.ClickException(
                f"no store at {path}: run the gateway (or `prefixgate demo`) first"
            )
