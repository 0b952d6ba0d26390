"""``prefixgate``: one command, with subcommands."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import sys
import time

import click

from prefixgate import __version__
from prefixgate.config import LOOPBACK, ConfigError, load_config, quick_config


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="prefixgate")
def main() -> None:
    """A gateway for self-hosted LLM inference that keeps upstream prefix caches hot and
    says exactly why they are not."""


# -- serve ---------------------------------------------------------------------------------
@main.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="YAML config file.",
)
@click.option(
    "--upstream", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 (no config file)."
)
@click.option("--model", help="With --upstream: the one model name served (default: any).")
@click.option("--host", default=None, help="Listen address (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Listen port (default 8787).")
@click.option(
    "--store",
    "store_dsn",
    default=None,
    help="Record store DSN (sqlite:///file.db or postgresql://…).",
)
@click.option("--log-level", default="info", show_default=True)
def serve(config_path, upstream, model, host, port, store_dsn, log_level) -> None:
    """Run the gateway.

    With neither --config nor --upstream it serves an embedded simulated vLLM upstream, so
    it runs with nothing else installed. Without configured API keys it accepts any key and
    binds to loopback only.
    """
    _setup_logging(log_level)
    try:
        if config_path:
            if upstream or model:
                raise click.UsageError("--upstream/--model go without --config")
            config = load_config(config_path)
            overrides: dict = {}
            if host or port:
                overrides["server"] = config.server.model_copy(
                    update={k: v for k, v in (("host", host), ("port", port)) if v}
                )
            if store_dsn:
                overrides["store"] = (
                    config.store or type(config).model_fields["store"].default
                ).model_copy(update={"dsn": store_dsn})
            if overrides:
                config = config.model_copy(update=overrides)
        else:
            config = quick_config(upstream, model, host or "127.0.0.1", port or 8787, store_dsn)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if config.open_access and config.server.host not in LOOPBACK:
        raise click.ClickException(
            f"refusing to listen on {config.server.host} without API keys: configure keys, or bind to 127.0.0.1"
        )
    log = logging.getLogger("prefixgate")
    if config.open_access:
        log.warning("no API keys configured: accepting any key (loopback only)")
    asyncio.run(_serve(config))


async def _serve(config) -> None:
    from prefixgate.server import build_app
    from prefixgate.serving import bind, uvicorn_server

    log = logging.getLogger("prefixgate")
    sims = []
    if config.embedded_upstream:
        from prefixgate.sim.upstream import SimSettings, start_embedded

        sim_url, sims = await start_embedded(SimSettings(block_size=64))
        channels = (config.channels[0].model_copy(update={"base_url": sim_url}),)
        config = config.model_copy(update={"channels": channels})
        log.info("embedded simulated upstream at %s", sim_url)
    app = build_app(config)
    sock = bind(config.server.host, config.server.port)
    server = uvicorn_server(app, log_level="warning", graceful=30)
    log.info("prefixgate listening on http://%s:%s", config.server.host, sock.getsockname()[1])
    try:
        await server.serve(sockets=[sock])
    finally:
        for s in sims:
            s.should_exit = True


# -- demo ----------------------------------------------------------------------------------
@main.command()
@click.option(
    "--sessions",
    type=int,
    default=12,
    show_default=True,
    help="Agent sessions (half Claude-Code-like).",
)
@click.option("--turns", type=int, default=12, show_default=True, help="Turns per session.")
@click.option(
    "--concurrency", type=int, default=6, show_default=True, help="Sessions in flight at once."
)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option(
    "--store",
    "store_path",
    default="prefixgate-demo.db",
    show_default=True,
    help="SQLite file written.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def demo(sessions, turns, concurrency, seed, store_path, as_json) -> None:
    """Reproduce the seed incident and its fix: the same Claude-Code-like and stable-prefix
    traffic through the gateway with the billing-header protection off, then on."""
    import contextlib
    import json

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from prefixgate import demo as demo_mod

    console = Console(stderr=as_json)

    @contextlib.contextmanager
    def progress_factory(name: str, total: int):
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=as_json,
        ) as progress:
            task = progress.add_task(name, total=total)
            yield lambda: progress.advance(task)

    t0 = time.monotonic()
    results = demo_mod.run_demo(
        sessions=sessions,
        turns=turns,
        seed=seed,
        concurrency=concurrency,
        store_path=store_path,
        progress_factory=progress_factory,
    )
    if as_json:
        click.echo(json.dumps(demo_mod.as_json(results), indent=2))
        return
    _print_demo(console, results, demo_mod.BLOCK)
    console.print(
        f"\nRecords written to [bold]{store_path}[/] ({time.monotonic() - t0:.1f} s). "
        f"Read them with: prefixgate doctor --store sqlite:///{store_path}"
    )


def _print_demo(console, results, block: int) -> None:
    from rich.table import Table

    table = Table(title="prefixgate demo: Claude Code's billing header at token 0")
    for col in (
        "phase",
        "entry",
        "requests",
        "prompt tokens",
        "cached tokens",
        "hit rate",
        "in-session",
        "pinned at one constant",
    ):
        table.add_column(col, justify="left" if col in ("phase", "entry") else "right")
    for r in results:
        for entry in ("messages", "chat"):
            st = r.entries.get(entry)
            if st is None:
                continue
            pinned = "-"
            if st.pinned_value is not None:
                k = st.pinned_value // block if st.pinned_value % block == 0 else None
                shape = f" = {k} x {block}" if k is not None else ""
                pinned = f"{st.pinned_count}/{st.requests} at {st.pinned_value}{shape}"
            table.add_row(
                r.name,
                "/v1/messages" if entry == "messages" else "/v1/chat/completions",
                str(st.requests),
                f"{st.prompt_tokens:,}",
                f"{st.cached_tokens:,}",
                f"{st.hit_rate:.1%}",
                f"{st.in_session_hit_rate:.1%}",
                pinned,
            )
        table.add_section()
    console.print(table)


# -- keys ----------------------------------------------------------------------------------
@main.group()
def keys() -> None:
    """API keys: generate one and the digest to put in the config."""


@keys.command("hash")
@click.argument("key", required=False)
def keys_hash(key: str | None) -> None:
    """Print the SHA-256 digest of KEY (read from stdin when omitted) for key_sha256."""
    if key is None:
        key = sys.stdin.readline().strip()
    click.echo(hashlib.sha256(key.encode()).hexdigest())


@keys.command("new")
@click.option("--prefix", default="pg-", show_default=True)
def keys_new(prefix: str) -> None:
    """Generate a new random key and print it with its digest (store only the digest)."""
    key = prefix + secrets.token_urlsafe(32)
    click.echo(f"key:        {key}")
    click.echo(f"key_sha256: {hashlib.sha256(key.encode()).hexdigest()}")


if __name__ == "__main__":  # pragma: no cover
    main()
