"""``prefixgate``: one command, with subcommands."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

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
@click.option(
    "--workers",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Worker processes sharing the port (SO_REUSEPORT). In-memory state is per worker.",
)
@click.option(
    "--http",
    "http_impl",
    type=click.Choice(["prefixgate", "uvicorn"]),
    default="prefixgate",
    show_default=True,
    help="HTTP server: the gateway's own (docs/performance.md), or uvicorn as a fallback.",
)
@click.option("--log-level", default="info", show_default=True)
def serve(
    config_path, upstream, model, host, port, store_dsn, workers, http_impl, log_level
) -> None:
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
    from prefixgate.serve import process as serving

    if workers == 1:
        serving.run(_serve(config, http_impl=http_impl))
        return
    log.info("prefixgate: %d worker processes", workers)

    def worker(sock, i: int) -> None:
        cfg = config
        if cfg.store is not None:  # one spool file per worker: they append independently
            spool = f"{cfg.store.spool_path or 'prefixgate-spool.jsonl'}.{i}"
            cfg = cfg.model_copy(
                update={"store": cfg.store.model_copy(update={"spool_path": spool})}
            )
        serving.run(_serve(cfg, sock, http_impl=http_impl))

    sys.exit(serving.run_workers(workers, config.server.host, config.server.port, worker))


async def _serve(config, sock=None, *, http_impl: str = "prefixgate") -> None:
    from prefixgate.serve.app import build_app
    from prefixgate.serve.process import bind, http_server, uvicorn_server

    log = logging.getLogger("prefixgate")
    sims = []
    if config.embedded_upstream:
        from prefixgate.upstream_sim import SimSettings, start_embedded

        sim_url, sims = await start_embedded(SimSettings(block_size=64))
        channels = (config.channels[0].model_copy(update={"base_url": sim_url}),)
        config = config.model_copy(update={"channels": channels})
        log.info("embedded simulated upstream at %s", sim_url)
    app = build_app(config)
    sock = sock if sock is not None else bind(config.server.host, config.server.port)
    limits = config.limits
    if http_impl == "uvicorn":
        server = uvicorn_server(app, log_level="warning", graceful=30)
    else:
        server = http_server(
            app,
            graceful=30,
            max_body=limits.max_body_bytes,
            max_header_bytes=max(1024 * 1024, 2 * limits.max_header_bytes),
            busy_poll_us=config.server.busy_poll_us,
            busy_poll_share=config.server.busy_poll_share,
        )
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
@click.option(
    "--vllm-version",
    default=None,
    help="vLLM release whose usage fields are imitated (default 0.32: cached_tokens 0 is "
    "reported; earlier releases omit prompt_tokens_details when nothing hit).",
)
@click.option(
    "--no-cache-report",
    "report_cached_tokens",
    flag_value=False,
    default=None,
    help="Never report cached tokens (vLLM without --enable-prompt-tokens-details).",
)
@click.option("--log-level", default="info", show_default=True)
def upstream_sim(host, port, replicas, log_level, **opts) -> None:
    """An OpenAI-compatible server whose prefix cache is prefixgate's cache model: vLLM's
    chained block hashes, last-token rule and LRU, with vLLM's usage fields and /metrics."""
    from prefixgate.upstream_sim import serve_upstreams, settings_from_options

    _setup_logging(log_level)
    settings = settings_from_options(**opts)

    def ready(urls) -> None:
        for u in urls:
            click.echo(f"upstream-sim listening on {u}/v1", err=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_upstreams(settings, host=host, port=port, replicas=replicas, ready=ready))


def _register_subcommands() -> None:
    # Larger commands live beside their code; they import their heavy parts lazily.
    from prefixgate.bench.cli import bench_command
    from prefixgate.commands.demo import demo
    from prefixgate.commands.doctor import doctor
    from prefixgate.commands.keys import keys
    from prefixgate.simulate.cli import simulate_command

    main.add_command(demo, "demo")
    main.add_command(doctor, "doctor")
    main.add_command(keys, "keys")
    main.add_command(simulate_command, "simulate")
    main.add_command(bench_command, "bench")


_register_subcommands()

if __name__ == "__main__":  # pragma: no cover
    main()
