"""`prefixgate reload`: check a config, then tell the running gateway to serve it (SIGHUP)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import click


@click.command("reload")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    required=True,
    help="The config file the gateway was started with (checked here first).",
)
@click.option("--pid", type=int, default=None, help="The gateway's pid (systemd: $MAINPID).")
@click.option(
    "--pid-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="The file `serve --pid-file` wrote.",
)
@click.option(
    "--url",
    default=None,
    help="The gateway's URL: wait for its answer (/healthz?details, with the admin key from "
    "$PREFIXGATE_ADMIN_KEY) and print it.",
)
def reload_command(config_path, pid, pid_file, url) -> None:
    """Check CONFIG (it must parse and validate, as the gateway will check it again), then
    send SIGHUP to the gateway: it serves the new config to new requests, lets the
    requests in flight finish on the old one, and says what needs a restart. A config
    that fails the check is not sent: the gateway keeps serving the old one."""
    from prefixgate.config import ConfigError, load_config
    from prefixgate.reload import check

    try:
        check(load_config(config_path))
    except (ConfigError, ValueError) as exc:
        raise click.ClickException(f"not reloaded: {exc}") from None
    if (pid is None) == (pid_file is None):
        raise click.UsageError("give the gateway's --pid or its --pid-file")
    if pid is None:
        try:
            pid = int(Path(pid_file).read_text().strip())
        except (OSError, ValueError) as exc:
            raise click.ClickException(f"cannot read the pid file {pid_file}: {exc}") from None
    before = _state(url) if url else None
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        raise click.ClickException(f"cannot signal the gateway (pid {pid}): {exc}") from None
    click.echo(f"config checked; SIGHUP sent to pid {pid}", err=True)
    if url:
        _report(_wait(url, before))


def _state(url: str) -> dict:
    import httpx

    key = os.environ.get("PREFIXGATE_ADMIN_KEY")
    headers = {"authorization": f"Bearer {key}"} if key else {}
    try:
        r = httpx.get(url.rstrip("/") + "/healthz?details", headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach the gateway at {url}: {exc}") from None
    if r.status_code != 200:
        raise click.ClickException(f"{url}/healthz?details answered {r.status_code}: {r.text}")
    return r.json()["details"]["config"]


def _wait(url: str, before: dict | None, timeout: float = 30.0) -> dict:
    """The gateway's state once its last reload is not the one ``before`` named."""
    seen = (before or {}).get("last_reload") or {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _state(url)
        last = state.get("last_reload") or {}
        if last and last.get("at") != seen.get("at"):
            return state
        time.sleep(0.1)
    raise click.ClickException(f"the gateway did not report a reload within {timeout:.0f} s")


def _report(state: dict) -> None:
    last = state["last_reload"]
    if not last["applied"]:
        raise click.ClickException(
            f"refused; generation {state['generation']} keeps serving: {last['reason']}"
        )
    click.echo(
        f"generation {last['generation']} serves (swapped in {last['seconds'] * 1000:.1f} ms; "
        f"{last['in_flight_on_previous']} requests finish on the previous one)"
    )
    for line in last["needs_restart"]:
        click.echo(f"  kept: {line}")
