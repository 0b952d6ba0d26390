"""What ``prefixgate serve`` tells the operator: one short block at start (where it
listens, the dashboard, where records go, each upstream checked, the edge's bounds) and
one-line errors for what stops it from starting.

Why: a gateway that starts silently in front of a dead upstream, or of a URL without its
``/v1``, answers ``/healthz`` 200 and every request 502; the operator learns it from the
users. The check here asks each upstream for its ``/models`` before the first request does,
and says what it answered, so a wrong URL shows at start. It never stops the start: an
upstream may come up later.
"""

from __future__ import annotations

import asyncio
import errno
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from prefixgate.config import ChannelConfig, Config, Timeouts
from prefixgate.errors import GatewayError

CHECK_TIMEOUTS = Timeouts(connect=2.0, first_byte=3.0, idle=3.0)
_SHOWN_MODELS = 5


def safe_url(url: str) -> str:
    """``url`` without credentials or query string: fit for a log line."""
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return url.split("?", 1)[0]
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    if parts.username or parts.password:
        host = "…@" + host
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


@dataclass
class UpstreamCheck:
    channel: str
    url: str
    models: list[str] = field(default_factory=list)
    error: str = ""  # empty: /models answered
    hint: str = ""


def _models_request(ch: ChannelConfig, base: str) -> tuple[str, dict]:
    key = ch.api_key()
    if ch.kind == "openai":
        return base + "/models", ({"authorization": f"Bearer {key}"} if key else {})
    headers = {"anthropic-version": "2023-06-01"}
    if key:
        headers["x-api-key"] = key
    return (base if base.endswith("/v1") else base + "/v1") + "/models", headers


def _ids(doc) -> list[str]:
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise GatewayError("the answer has no model list (`data`)")
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


async def _check_one(client, ch: ChannelConfig, base: str) -> UpstreamCheck:
    check = UpstreamCheck(ch.name, safe_url(base))
    url, headers = _models_request(ch, base)
    try:
        check.models = _ids(
            await client.get_json(url, timeouts=CHECK_TIMEOUTS, extra_headers=headers)
        )
        return check
    except GatewayError as err:
        check.error = err.message
    if ch.kind == "openai" and not urlsplit(base).path.rstrip("/").endswith("/v1"):
        check.hint = (
            f"{check.url} has no /v1: OpenAI-compatible servers (vLLM, SGLang) serve their "
            "API under /v1"
        )
        try:
            await client.get_json(
                base + "/v1/models", timeouts=CHECK_TIMEOUTS, extra_headers=headers
            )
            check.hint += f", and {check.url}/v1/models answers: use {check.url}/v1"
        except GatewayError:
            pass
    return check


async def check_upstreams(config: Config) -> list[UpstreamCheck]:
    """Ask every upstream URL of every channel for its models, all at once (a few
    seconds at most when one does not answer)."""
    from prefixgate.engine.client import EngineClient
    from prefixgate.upstream.client import Upstream

    client = EngineClient(Upstream())
    try:
        return list(
            await asyncio.gather(
                *(_check_one(client, ch, base) for ch in config.channels for base in ch.urls())
            )
        )
    finally:
        await client.aclose()


def _upstream_line(c: UpstreamCheck) -> list[str]:
    if not c.error:
        names = ", ".join(c.models[:_SHOWN_MODELS]) or "none listed"
        if len(c.models) > _SHOWN_MODELS:
            names += f" and {len(c.models) - _SHOWN_MODELS} more"
        lines = [f"  upstream   {c.channel}: {c.url}: /models answered: {names}"]
    else:
        lines = [
            f"  upstream   {c.channel}: {c.url}: WARNING: /models did not answer ({c.error}); "
            "requests routed there will fail until it does"
        ]
    if c.hint:
        lines.append(f"  hint       {c.hint}")
    return lines


def start_block(
    config: Config,
    url: str,
    *,
    http_impl: str,
    workers: int,
    open_files: tuple[int, int],
    max_connections: int,
    checks: list[UpstreamCheck],
    embedded: str | None = None,
) -> str:
    """The block printed once the gateway listens."""
    server = config.server
    lines = [
        f"prefixgate listening on {url}  "
        f"({'own HTTP server' if http_impl == 'prefixgate' else 'uvicorn'}, "
        f"{workers} worker{'s' if workers > 1 else ''})"
    ]
    store = config.store
    if store is not None:
        if config.admin_digest():
            access = "admin key required"
        elif config.open_access:
            access = "open: no keys configured, loopback only"
        else:
            access = "disabled: no admin key configured"
        lines.append(f"  dashboard  {url}/dashboard  ({access})")
        journal = (
            f"journaled first in {store.journal_path}/"
            if store.journal_path
            else "no journal: held in memory until stored"
        )
        lines.append(f"  records    {safe_url(store.dsn)}  ({journal})")
    else:
        lines.append("  records    none: no store configured")
    if embedded:
        lines.append(f"  upstream   the embedded simulated vLLM at {embedded}")
    for c in checks:
        lines += _upstream_line(c)
    before, files = open_files
    raised = f" (raised from {before})" if files > before else ""
    lines.append(
        f"  edge       open files {files}{raised}, at most {max_connections} connections; "
        f"a request head within {server.head_timeout:g} s, a body never idle "
        f"{server.body_timeout:g} s nor under {server.body_min_rate:g} B/s; "
        f"keep-alive {server.keepalive:g} s"
    )
    poll = f"{server.busy_poll_us:g} us" if server.busy_poll_us else "off"
    lines.append(
        f"  options    access log {'on' if server.access_log else 'off'}, busy polling {poll}"
    )
    return "\n".join(lines)


def bind_error(host: str, port: int, exc: OSError) -> str:
    """One line for a socket that cannot be bound."""
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return f"cannot listen on {where}: the port is already in use (another prefixgate?); choose another with --port"
    if exc.errno == errno.EACCES:
        return f"cannot listen on {where}: permission denied (ports below 1024 need privileges)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {where}: no such address on this machine"
    return f"cannot listen on {where}: {exc.strerror or exc}"
