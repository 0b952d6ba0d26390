"""``prefixgate``: one command, with subcommands."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import shutil
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


# -- upstream-sim --------------------------------------------------------------------------
@main.command("upstream-sim")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--port",
    type=int,
    default=8000,
    show_default=True,
    help="First port; replicas take the next ones.",
)
@click.option(
    "--replicas",
    type=int,
    default=1,
    show_default=True,
    help="Independent servers, each with its own cache.",
)
@click.option(
    "--model", default=None, help="Served model names, comma-separated (any name is accepted)."
)
@click.option("--block-size", type=int, default=None, help="KV block size in tokens (default 16).")
@click.option(
    "--capacity-tokens",
    type=int,
    default=None,
    help="Cache capacity in tokens (default unlimited).",
)
@click.option(
    "--prefill-rate",
    type=float,
    default=None,
    help="Prefill tokens/s for uncached tokens (0 = instant).",
)
@click.option("--decode-rate", type=float, default=None, help="Decode tokens/s (0 = instant).")
@click.option("--render-order", type=click.Choice(["tools_first", "system_first"]), default=None)
@click.option(
    "--chat-template",
    type=click.Path(exists=True),
    default=None,
    help="Jinja chat template or tokenizer_config.json.",
)
@click.option("--tokenizer", default=None, help="approx | hf:PATH | remote:URL[#model].")
@click.option("--max-model-len", type=int, default=None)
@click.option(
    "--default-output-tokens",
    type=int,
    default=None,
    help="Output length when the request sets no ignore_eos (default 32).",
)
@click.option("--log-level", default="info", show_default=True)
def upstream_sim(host, port, replicas, log_level, **opts) -> None:
    """An OpenAI-compatible server whose prefix cache is prefixgate's cache model: vLLM's
    chained block hashes, last-token rule and LRU, with vLLM's usage fields and /metrics."""
    from prefixgate.sim.upstream import serve_upstreams, settings_from_options

    _setup_logging(log_level)
    settings = settings_from_options(**opts)

    def ready(urls) -> None:
        for u in urls:
            click.echo(f"upstream-sim listening on {u}/v1", err=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_upstreams(settings, host=host, port=port, replicas=replicas, ready=ready))


# -- demo ----------------------------------------------------------------------------------
@main.command()
@click.option(
    "--sessions",
    type=int,
    default=10,
    show_default=True,
    help="Agent sessions (half Claude-Code-like).",
)
@click.option("--turns", type=int, default=40, show_default=True, help="Turns per session.")
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
    import json

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from prefixgate import demo as demo_mod

    console = Console(stderr=as_json, width=max(100, shutil.get_terminal_size().columns))

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
    from prefixgate.doctor import diagnose, render_text

    diagnosis = diagnose(results[0].dsn)
    if as_json:
        click.echo(json.dumps(demo_mod.as_json(results, diagnosis), indent=2))
        return
    _print_demo(console, results, demo_mod.BLOCK)
    console.rule("prefixgate doctor on the incident's store")
    click.echo(render_text(diagnosis))
    predicted = demo_mod.predicted_rate(diagnosis)
    if predicted is not None:
        measured = results[1].entries["messages"].hit_rate
        console.print(
            f"\nThe doctor predicted {predicted:.1%} for /v1/messages after the fix; "
            f"the replay with the fix measured {measured:.1%}."
        )
    console.print(
        f"\nRecords: [bold]{store_path}[/] (the incident), "
        f"[bold]{demo_mod.fixed_store_path(store_path)}[/] (the fix); {time.monotonic() - t0:.1f} s. "
        f"Again: prefixgate doctor --store sqlite:///{store_path}"
    )


def _print_demo(console, results, block: int) -> None:
    from rich import box
    from rich.table import Table

    table = Table(
        title="prefixgate demo: the billing header at token 0", box=box.SIMPLE_HEAD, pad_edge=False
    )
    for col in (
        "header",
        "entry",
        "requests",
        "prompt",
        "cached",
        "hit rate",
        "in-session",
        "pinned",
    ):
        left = col in ("header", "entry", "pinned")
        table.add_column(col, justify="left" if left else "right", no_wrap=True)
    for r in results:
        for entry in ("messages", "chat"):
            st = r.entries.get(entry)
            if st is None:
                continue
            pinned = "-"
            if st.pinned_value is not None:
                shape = (
                    f"={st.pinned_value // block}x{block}" if st.pinned_value % block == 0 else ""
                )
                pinned = f"{st.pinned_count} @ {st.pinned_value}{shape}"
            table.add_row(
                "stripped" if r.strip else "kept",
                entry,
                str(st.requests),
                _human(st.prompt_tokens),
                _human(st.cached_tokens),
                f"{st.hit_rate:.1%}",
                f"{st.in_session_hit_rate:.1%}",
                pinned,
            )
        table.add_section()
    console.print(table)
    console.print(
        "header: Claude Code's billing header kept at token 0 (the incident) or stripped (the fix).\n"
        "entry: messages = /v1/messages (Claude-Code-like sessions), chat = /v1/chat/completions "
        "(a stable-prefix agent, the control group).\n"
        "hit rate = sum(cached) / sum(prompt) tokens; in-session = the same over every request after "
        "a session's first; pinned = requests whose cached length is one exact constant."
    )


def _human(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1_000_000 else f"{n / 1e3:.1f}k" if n >= 1000 else str(n)


# -- doctor --------------------------------------------------------------------------------
@main.command()
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

    config = _config_of(config_path)
    if config is not None and not metrics_url:
        metrics_url = tuple(c.metrics_url for c in config.channels if c.metrics_url)
    store_dsn = _store_dsn(store_dsn, config)
    _require_sqlite_file(store_dsn)
    try:
        window = {k: parse_time(v) for k, v in (("since", since), ("until", until)) if v}
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    d = diagnose(store_dsn, metrics_urls=metrics_url, engine_log=engine_log, **window)
    click.echo(to_json(d, indent=2) if as_json else render_text(d))
    sys.exit(exit_code(d))


def _config_of(config_path: str | None):
    if not config_path:
        return None
    try:
        return load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _store_dsn(store_dsn: str | None, config) -> str:
    """--store, else the config's store, else the default SQLite file."""
    if store_dsn is None and config is not None:
        if config.store is None:
            raise click.ClickException("the config has no store")
        store_dsn = config.store.dsn
    return store_dsn or "sqlite:///prefixgate.db"


def _require_sqlite_file(dsn: str) -> None:
    from pathlib import Path

    if dsn.startswith("sqlite:///") and ":memory:" not in dsn:
        path = Path(dsn.removeprefix("sqlite:///"))
        if not path.exists():
            raise click.ClickException(
                f"no store at {path}: run the gateway (or `prefixgate demo`) first"
            )


# -- keys ----------------------------------------------------------------------------------
@main.group()
def keys() -> None:
    """API keys: generate one and the digest to put in the config."""


def _key_store(store_dsn: str | None, config_path: str | None):
    from prefixgate.store import open_store

    store = open_store(_store_dsn(store_dsn, _config_of(config_path)))
    store.migrate()
    return store


_store_opts = [
    click.option(
        "--store", "store_dsn", default=None, help="Store DSN (default sqlite:///prefixgate.db)."
    ),
    click.option(
        "--config",
        "config_path",
        type=click.Path(exists=True, dir_okay=False),
        help="Take the store from this config.",
    ),
]


def _with_store(f):
    for opt in reversed(_store_opts):
        f = opt(f)
    return f


@keys.command("create")
@click.argument("name")
@click.option("--owner", default=None, help="Who the key belongs to (a team, a person).")
@click.option(
    "--models", default="", help="Allowed models, comma-separated (default: every model)."
)
@click.option("--prefix", default="pg-", show_default=True)
@_with_store
def keys_create(name, owner, models, prefix, store_dsn, config_path) -> None:
    """Create an API key in the store and print it ONCE; only its digest is kept. The
    gateway accepts store keys when its config has `store_keys: true`."""
    from prefixgate.store import StoreError

    key = prefix + secrets.token_urlsafe(32)
    allowed = tuple(m.strip() for m in models.split(",") if m.strip())
    with _key_store(store_dsn, config_path) as store:
        try:
            store.create_key(name, owner, hashlib.sha256(key.encode()).hexdigest(), allowed)
        except StoreError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(key)
    click.echo(f"created key {name!r} (shown once; only its digest is stored)", err=True)


@keys.command("list")
@click.option("--json", "as_json", is_flag=True)
@_with_store
def keys_list(as_json, store_dsn, config_path) -> None:
    """List the store's keys (names, owners, models, digests' first characters)."""
    import json

    with _key_store(store_dsn, config_path) as store:
        rows = store.list_keys()
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "name": r.name,
                        "owner": r.owner,
                        "models": list(r.models),
                        "digest_prefix": r.digest[:12],
                        "created_at": r.created_at,
                        "revoked_at": r.revoked_at,
                    }
                    for r in rows
                ],
                indent=2,
            )
        )
        return
    for r in rows:
        state = "revoked" if r.revoked_at else "active"
        models = ",".join(r.models) or "*"
        click.echo(
            f"{r.name:20} {state:8} owner={r.owner or '-':12} models={models:20} sha256={r.digest[:12]}…"
        )


@keys.command("revoke")
@click.argument("name")
@_with_store
def keys_revoke(name, store_dsn, config_path) -> None:
    """Revoke a store key; gateways stop accepting it within seconds."""
    with _key_store(store_dsn, config_path) as store:
        if not store.revoke_key(name):
            raise click.ClickException(f"no active key named {name!r}")
    click.echo(f"revoked {name!r}")


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


def _register_subcommands() -> None:
    # Larger commands live beside their code; they import their heavy parts lazily.
    from prefixgate.bench.cli import bench_command
    from prefixgate.simulate.cli import simulate_command

    main.add_command(simulate_command, "simulate")
    main.add_command(bench_command, "bench")


_register_subcommands()

if __name__ == "__main__":  # pragma: no cover
    main()
