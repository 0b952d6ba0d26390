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
@click.option(
    "--probe",
    is_flag=True,
    help="Send two identical small requests to each openai channel of --config (the second "
    "must hit): tells a cache report that is off from one with nothing to report.",
)
@click.option(
    "--min-loss-share",
    type=click.FloatRange(0, 1),
    default=0.02,
    show_default=True,
    help="Report a breaker costing this share of its client's prompt tokens ...",
)
@click.option(
    "--min-loss-per-day",
    type=click.FloatRange(0),
    default=5_000_000,
    show_default=True,
    help="... or this many prompt tokens a day (over a window of a day or more).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis as JSON.")
def doctor(
    store_dsn,
    config_path,
    since,
    until,
    metrics_url,
    engine_log,
    probe,
    min_loss_share,
    min_loss_per_day,
    as_json,
) -> None:
    """Diagnose lost prefix-cache hits from the record: what breaks each session's prefix
    (its class, where, what it costs, the fix and the predicted gain), the weak slice and
    its pinned constant, floods of failed requests; plus upstream cache health. Exits 2
    when a critical finding exists (for cron)."""
    from prefixgate.doctor import diagnose, exit_code, parse_time, render_text, to_json

    config = config_of(config_path)
    channel_metrics = {}
    if config is not None:
        channel_metrics = {c.name: c.metrics_url for c in config.channels if c.metrics_url}
    if probe and config is None:
        raise click.UsageError("--probe needs --config (the channels to probe)")
    store_dsn = store_dsn_of(store_dsn, config)
    require_sqlite_file(store_dsn)
    try:
        window = {k: parse_time(v) for k, v in (("since", since), ("until", until)) if v}
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    policies = {c.name: c.routing.policy for c in config.channels} if config is not None else None
    probes = None
    if probe:
        from prefixgate.doctor.cache_report import probe_all

        probes = probe_all(config.channels)
    d = diagnose(
        store_dsn,
        metrics_urls=metrics_url,
        engine_log=engine_log,
        channel_metrics=channel_metrics,
        probes=probes,
        min_loss_share=min_loss_share,
        min_loss_per_day=min_loss_per_day,
        policies=policies,
        **window,
    )
    click.echo(to_json(d, indent=2) if as_json else render_text(d))
    sys.exit(exit_code(d))
