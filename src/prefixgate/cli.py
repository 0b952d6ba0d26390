"""``prefixgate``: one command, with subcommands."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
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
@click.option(
    "--access-log",
    is_flag=True,
    default=False,
    help="One log line per request (as server.access_log: true).",
)
@click.option(
    "--pid-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the pid to signal (SIGHUP: reload; SIGTERM: hand over and drain) once the port "
    "is served.",
)
@click.option("--log-level", default="info", show_default=True)
def serve(
    config_path,
    upstream,
    model,
    host,
    port,
    store_dsn,
    workers,
    http_impl,
    access_log,
    pid_file,
    log_level,
) -> None:
    """Run the gateway.

    With neither --config nor --upstream it serves an embedded simulated vLLM upstream, so
    it runs with nothing else installed. Without configured API keys it accepts any key and
    binds to loopback only. SIGHUP re-reads --config (docs/operating.md); SIGTERM hands the
    port over to a new process on it and drains the requests in flight.
    """
    _setup_logging(log_level)
    if config_path and (upstream or model):
        raise click.UsageError("--upstream/--model go without --config")

    def load():
        if config_path:
            return _with_overrides(load_config(config_path), host, port, store_dsn, access_log)
        config = quick_config(upstream, model, host or "127.0.0.1", port or 8787, store_dsn)
        return _with_overrides(config, None, None, None, access_log)

    try:
        config = load()
        config.admin_digest()
        for key in config.keys:
            key.digest()  # a key_env that is not set is a config error, said now
    except (ConfigError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if config.open_access and config.server.host not in LOOPBACK:
        raise click.ClickException(
            f"refusing to listen on {config.server.host} without API keys: configure keys, or bind to 127.0.0.1"
        )
    log = logging.getLogger("prefixgate")
    if config.open_access:
        log.warning("no API keys configured: accepting any key (loopback only)")
    from prefixgate.serve import process as serving
    from prefixgate.serve.lifecycle import Lifecycle
    from prefixgate.serve.report import bind_error

    where = (config.server.host, config.server.port)
    edge = _Edge(config, http_impl, workers, serving.raise_open_files())
    reload_from = load if config_path else None
    # A SIGHUP before the loop handles it (a reload sent during the start) is not a kill.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        if workers == 1:
            try:
                sock = serving.bind(*where, reuse_port=True)  # a successor may bind it too
            except OSError as exc:
                raise click.ClickException(bind_error(*where, exc)) from None
            life = Lifecycle(reload_from, pid_file)
            serving.run(_serve(config, sock, edge=edge, report=True, life=life))
            return
        log.info("prefixgate: %d worker processes", workers)
        parent = os.getpid()
        from prefixgate.auth import KeyEpoch

        epoch = KeyEpoch() if config.store_keys else None  # shared by the forked workers

        def worker(sock, i: int) -> None:  # each claims its own slot in the record journal
            life = Lifecycle(reload_from, pid_file, pid=parent, announce=i == 0)
            serving.run(_serve(config, sock, edge=edge, report=i == 0, life=life, key_epoch=epoch))

        try:
            status = serving.run_workers(workers, *where, worker)
        except OSError as exc:
            raise click.ClickException(bind_error(*where, exc)) from None
        sys.exit(status)
    except KeyboardInterrupt:  # SIGINT before the server's own handler was in place
        sys.exit(130)


def _with_overrides(config, host, port, store_dsn, access_log):
    """``config`` with the command line's --host, --port, --store and --access-log (a
    reload applies them again to the file it reads)."""
    overrides: dict = {}
    if host or port:
        overrides["server"] = config.server.model_copy(
            update={k: v for k, v in (("host", host), ("port", port)) if v}
        )
    if store_dsn:
        overrides["store"] = (
            config.store or type(config).model_fields["store"].default
        ).model_copy(update={"dsn": store_dsn})
    if access_log:
        server = overrides.get("server", config.server)
        overrides["server"] = server.model_copy(update={"access_log": True})
    return config.model_copy(update=overrides) if overrides else config


class _Edge:
    """How ``serve`` runs its HTTP server: which one, the open-file limit it raised at
    start, and the edge's bounds from ``server:`` (the connection cap lowered to what the
    open files allow)."""

    def __init__(self, config, http_impl: str, workers: int, open_files: tuple[int, int]):
        from prefixgate.serve.edge import EdgeLimits
        from prefixgate.serve.process import connection_cap

        s = config.server
        self.http_impl, self.workers, self.open_files = http_impl, workers, open_files
        self.limits = EdgeLimits(
            head_timeout=s.head_timeout,
            body_timeout=s.body_timeout,
            body_min_rate=s.body_min_rate,
            keepalive=s.keepalive,
            max_connections=connection_cap(s.max_connections, open_files[1]),
        )


EMBEDDED_KEY_ENV = "PREFIXGATE_EMBEDDED_UPSTREAM_KEY"


def _embedded_in(config, url: str):
    """``config`` with its first channel sent to the embedded upstream at ``url``, with
    the embedded upstream's key."""
    update = {"base_url": url, "api_key_env": EMBEDDED_KEY_ENV}
    channels = (config.channels[0].model_copy(update=update), *config.channels[1:])
    return config.model_copy(update={"channels": channels})


async def _serve(
    config, sock, *, edge: _Edge, report: bool = True, life=None, key_epoch=None
) -> None:
    from prefixgate.serve.app import build_app, refusal_app
    from prefixgate.serve.process import http_server, uvicorn_server
    from prefixgate.serve.report import check_upstreams, start_block

    sims = []
    embedded = None
    if config.embedded_upstream:
        from prefixgate.lab.upstream_sim import SimSettings, start_embedded

        # Its own random key: nobody else on the machine reaches it past the gateway.
        os.environ[EMBEDDED_KEY_ENV] = secrets.token_urlsafe(32)
        settings = SimSettings(block_size=64, api_key=os.environ[EMBEDDED_KEY_ENV])
        embedded, sims = await start_embedded(settings)
        config = _embedded_in(config, embedded)
        if life is not None and life.load is not None:  # a reload keeps the embedded one
            read = life.load
            life.load = lambda: _embedded_in(read(), embedded)
    checks = [] if (embedded or not report) else await check_upstreams(config)
    host = config.server.host
    url = f"http://{f'[{host}]' if ':' in host else host}:{sock.getsockname()[1]}"

    def started() -> None:
        if life is not None:
            life.started()
        if report:
            block = start_block(
                config,
                url,
                http_impl=edge.http_impl,
                workers=edge.workers,
                open_files=edge.open_files,
                max_connections=edge.limits.max_connections,
                checks=checks,
                embedded=embedded,
            )
            click.echo(block, err=True)

    app = build_app(config)
    limits = config.limits
    refusal = refusal_app(edge.limits.max_connections)
    header_bound = max(1024 * 1024, 2 * limits.max_header_bytes)
    if edge.http_impl == "uvicorn":
        server = uvicorn_server(
            app,
            log_level="warning",
            graceful=config.server.drain_timeout,
            edge=edge.limits,
            refusal=refusal,
            max_header_bytes=header_bound,
            on_started=started,
        )
    else:
        server = http_server(
            app,
            graceful=config.server.drain_timeout,
            handover=(edge.workers, None),
            max_body=limits.max_body_bytes,
            max_header_bytes=header_bound,
            busy_poll_us=config.server.busy_poll_us,
            busy_poll_share=config.server.busy_poll_share,
            edge=edge.limits,
            refusal=refusal,
            on_started=started,
        )
    app.state.gateway.key_epoch = key_epoch
    if life is not None:
        life.install(app.state.gateway)
    try:
        await server.serve(sockets=[sock])
    finally:
        if life is not None:
            life.uninstall()
            life.stopped()
        for s in sims:  # stopped and awaited: a task left running is cancelled noisily
            s.should_exit = True
        tasks = [s.config.app.state.serve_task for s in sims]
        if tasks:
            await asyncio.wait(tasks, timeout=10)


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
@click.option(
    "--kv-events-config",
    default=None,
    help="Publish KV events as vLLM does: vLLM's JSON (endpoint, replay_endpoint, topic, "
    'buffer_steps), plus "encoding": map|array|map-batch. Replica i: ports + i.',
)
@click.option(
    "--strict-models/--any-model",
    "strict_models",
    default=None,
    help="Refuse a model not in --model with vLLM's 404, as vLLM does (default: any).",
)
@click.option(
    "--api-key-env",
    default=None,
    help="An environment variable holding the key every route but /health asks for "
    "(Authorization: Bearer), as vLLM's --api-key.",
)
@click.option("--log-level", default="info", show_default=True)
def upstream_sim(host, port, replicas, log_level, strict_models, api_key_env, **opts) -> None:
    """An OpenAI-compatible server whose prefix cache is prefixgate's cache model: vLLM's
    chained block hashes, last-token rule and LRU, with vLLM's usage fields and /metrics."""
    from prefixgate.lab.upstream_sim import serve_upstreams, settings_from_options

    _setup_logging(log_level)
    if strict_models is not None:
        opts["accept_any_model"] = not strict_models
    if api_key_env:
        if not os.environ.get(api_key_env):
            raise click.UsageError(f"--api-key-env: {api_key_env} is not set")
        opts["api_key"] = os.environ[api_key_env]
    elif host not in ("127.0.0.1", "::1", "localhost"):
        raise click.UsageError(
            "a simulated upstream without a key listens on loopback only: "
            "give it one with --api-key-env, or --host 127.0.0.1"
        )
    settings = settings_from_options(**opts)

    def ready(urls) -> None:
        for u in urls:
            click.echo(f"upstream-sim listening on {u}/v1", err=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_upstreams(settings, host=host, port=port, replicas=replicas, ready=ready))


def _register_subcommands() -> None:
    # Larger commands live beside their code; they import their heavy parts lazily.
    from prefixgate.commands.doctor import doctor
    from prefixgate.commands.keys import keys
    from prefixgate.commands.reload import reload_command
    from prefixgate.commands.usage import usage
    from prefixgate.lab.bench.command import bench_command
    from prefixgate.lab.demo import demo
    from prefixgate.lab.simulate.command import simulate_command

    main.add_command(demo, "demo")
    main.add_command(doctor, "doctor")
    main.add_command(keys, "keys")
    main.add_command(reload_command, "reload")
    main.add_command(usage, "usage")
    main.add_command(simulate_command, "simulate")
    main.add_command(bench_command, "bench")


_register_subcommands()

if __name__ == "__main__":  # pragma: no cover
    main()
