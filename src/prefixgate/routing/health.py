"""Active health checks: probe each replica's health endpoint periodically.

For every channel with ``health.interval`` set, each replica is probed with
``GET {root}{health.path}``, where ``root`` is the replica's base URL without a trailing
``/v1`` (vLLM and SGLang serve ``/health`` at the root). A 2xx answer within
``health.timeout`` seconds marks the replica up; anything else marks it down. The result
goes to a callback (the router), which keeps the state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from prefixgate.config import ChannelConfig
from prefixgate.upstream.transport import Transport

log = logging.getLogger("prefixgate.routing")

__all__ = ["HealthChecker", "health_url"]


def health_url(base_url: str, path: str = "/health") -> str:
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root + (path if path.startswith("/") else "/" + path)


class HealthChecker:
    """Probes replicas; ``on_result(channel, url, healthy)`` receives every verdict."""

    def __init__(
        self,
        channels: tuple[ChannelConfig, ...],
        on_result: Callable[[ChannelConfig, str, bool], None],
        *,
        transport: Transport | None = None,
    ) -> None:
        self.channels = tuple(c for c in channels if c.health.interval)
        self.on_result = on_result
        self._transport = transport  # the gateway's upstream client; else one of its own
        self._own: Transport | None = None
        self._tasks: list[asyncio.Task] = []

    def _http(self) -> Transport:
        if self._transport is not None:
            return self._transport
        if self._own is None:
            from prefixgate.upstream import Upstream

            self._own = Upstream(max_connections=64)
        return self._own

    async def probe(self, channel: ChannelConfig, url: str) -> bool:
        status = await self._http().probe(
            health_url(url, channel.health.path), timeout=channel.health.timeout, tls=channel.tls
        )
        return 200 <= status < 300

    async def check_channel(self, channel: ChannelConfig) -> dict[str, bool]:
        urls = channel.urls()
        verdicts = await asyncio.gather(*(self.probe(channel, u) for u in urls))
        out = dict(zip(urls, verdicts, strict=True))
        for url, ok in out.items():
            self.on_result(channel, url, ok)
        return out

    async def check_all(self) -> dict[str, bool]:
        """One round over every checked channel (the periodic task's step)."""
        out: dict[str, bool] = {}
        for ch in self.channels:
            out.update(await self.check_channel(ch))
        return out

    async def _loop(self, channel: ChannelConfig) -> None:
        interval = float(channel.health.interval or 0)
        while True:
            try:
                await self.check_channel(channel)
            except Exception:  # never let the probe loop die
                log.exception("health check of channel %s failed", channel.name)
            await asyncio.sleep(interval)

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._loop(ch), name=f"prefixgate-health:{ch.name}")
                for ch in self.channels
            ]

    async def aclose(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        if self._own is not None:
            await self._own.aclose()
            self._own = None
