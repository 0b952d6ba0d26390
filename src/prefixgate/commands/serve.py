"""`prefixgate serve`: the gateway on its port, with the HTTP server, its edge and the
process's lifecycle (SIGHUP, the pid file, the workers); with neither a config nor an
upstream, an embedded simulated upstream (the lab's, loaded only then)."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import sys

import click

from prefixgate.commands.common import setup_logging
from prefixgate.config import LOOPBACK, ConfigError, load_config, quick_config


@click.command()
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
    setup_logging(log_level)
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
    from prefixgate.serve.startup_report import bind_error

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
    from prefixgate.gateway import Gateway
    from prefixgate.serve.app import create_app, refusal_app
    from prefixgate.serve.process import http_server, uvicorn_server
    from prefixgate.serve.startup_report import check_upstreams, start_block

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

    gateway = Gateway.from_config(config)
    gateway.key_epoch = key_epoch
    app = create_app(gateway)
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
    if life is not None:
        life.install(gateway)
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


__all__ = ["serve"]
