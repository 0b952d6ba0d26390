"""`prefixgate usage`: what was used and what it cost, by key, owner, model, client,
channel or day, from the store."""

from __future__ import annotations

import time

import click

from prefixgate.commands.common import config_of, require_sqlite_file, store_dsn_of, with_store


@click.command()
@click.option(
    "--by",
    type=click.Choice(["key", "owner", "model", "client", "channel", "day"]),
    default="key",
    show_default=True,
    help="Group the requests by this.",
)
@click.option(
    "--since",
    default="7d",
    show_default=True,
    help="Start: a date (2026-08-13), a span back (24h, 7d) or epoch seconds; 'all' for none.",
)
@click.option("--until", default=None, help="End, in the same forms.")
@with_store
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV.")
def usage(by, since, until, store_dsn, config_path, as_json, as_csv) -> None:
    """Requests, fresh/cached/written/output tokens, hit rate, cost, what the cache saved
    and what misses with a known cause lost, per group. Costs are the records' own, priced
    when they were served (`prices:` in the gateway's config)."""
    from prefixgate.doctor.timespec import parse_time
    from prefixgate.spend.prices import PriceTable
    from prefixgate.spend.usage_report import render_csv, render_json, render_text, usage_report
    from prefixgate.store import StoreError, open_store

    if as_json and as_csv:
        raise click.UsageError("--json and --csv go one at a time")
    config = config_of(config_path)
    dsn = store_dsn_of(store_dsn, config)
    require_sqlite_file(dsn)
    now = time.time()
    try:
        start = None if since in (None, "all") else parse_time(since, now=now)
        end = None if until is None else parse_time(until, now=now)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    where, params = "", []
    if start is not None:
        where, params = where + " AND received_at >= ?", [*params, start]
    if end is not None:
        where, params = where + " AND received_at < ?", [*params, end]
    prices = PriceTable.from_config(config.prices) if config and config.prices else None
    try:
        with open_store(dsn) as store:
            store.migrate()
            report = usage_report(
                store, by, where=where, params=params, prices=prices, since=start, until=end
            )
    except StoreError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(render_json(report))
    elif as_csv:
        click.echo(render_csv(report), nl=False)
    else:
        click.echo(render_text(report))
