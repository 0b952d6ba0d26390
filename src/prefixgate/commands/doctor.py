"""`prefixgate doctor`."""

from __future__ import annotations

import sys

import click

from prefixgate.commands.common import config_of, require_sqlite_file, store_dsn_of


@click.command()
@click.option(
    "--store", "store_dsn", default=None, help="Store DSN (default sqlite:///prefixgate.db)."
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Take the store from this config.",
)
@click.option(
    "--since",
    default=None,
    help="Start: a date (2026-08-13), a span back (24h, 7d) or epoch seconds.",
)
@click.option("--until", default=None, help="End, in the same forms.")
@click.option("--metrics-url", multiple=True, help="An upstream's /metrics URL (repeatable).")
@click.option(
    "--engine-log", type=click.Path(exists=True, dir_okay=False), help="A vLLM engine log file."
)
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis as JSON.")
def doctor(store_dsn, config_path, since, until, metrics_url, engine_log, as_json) -> None:
    """Diagnose lost prefix-cache hits from the record: the weak slice, the pinned constant,
    the segment that varies, the fix and the predicted gain; plus upstream cache health.
    Exits 2 when a critical finding exists (for cron)."""
    from prefixgate.doctor import diagnose, exit_code, parse_time, render_text, to_json

    config = config_of(config_path)
    if config is not None and not metrics_url:
        metrics_url = tuple(c.metrics_url for c in config.channels if c.metrics_url)
    store_dsn = store_dsn_of(store_dsn, config)
    require_sqlite_file(store_dsn)
    try:
        window = {k: parse_time(v) for k, v in (("since", since), ("until", until)) if v}
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    policies = {c.name: c.routing for c in config.channels} if config is not None else None
    d = diagnose(
        store_dsn, metrics_urls=metrics_url, engine_log=engine_log, policies=policies, **window
    )
    click.echo(to_json(d, indent=2) if as_json else render_text(d))
    sys.exit(exit_code(d))
