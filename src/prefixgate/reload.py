"""Config reload: ``SIGHUP`` or ``prefixgate reload`` makes a running gateway serve a new
config without a restart.

The new config was parsed and validated before it gets here (a file that does not parse
is refused and the old config keeps serving); :func:`check` adds what only a running
gateway can refuse (open access on a public address). What cannot change live (the
listen address and the server's bounds, the store, the dashboard's sessions, the admin
key, the shared Redis of limits and budgets, telemetry, a channel's KV-event
subscription) is kept as it was, and the reload says so: :func:`keep_fixed`. Everything
else (channels, replicas, models and maps, keys, budgets, prices, routing, hygiene
switches, limits) becomes a new generation (``live.py``): requests that arrive after
the swap use it; those in flight finish on theirs. A retired generation is closed once
its last request ended: its router's probes, and the upstream connections of replicas
that left (``Upstream.retire``)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import BaseModel

from prefixgate.config import LOOPBACK, Config, ConfigError

if TYPE_CHECKING:
    from prefixgate.gateway import Gateway
    from prefixgate.live import Live

log = logging.getLogger("prefixgate")

# Top-level sections a running gateway cannot change, and why (said in the reload's note).
FIXED = {
    "server": "the listen address, the edge's bounds and admission are set at start",
    "store": "the record writer, the journal and the ledger hold the store open",
    "dashboard": "the dashboard's sessions are set at start",
    "admin_key_sha256": "the dashboard's sessions are bound to the admin key",
    "admin_key_env": "the dashboard's sessions are bound to the admin key",
    "embedded_upstream": "the embedded upstream is started with the process",
    "store_keys": "the store's keys are polled from start",
    "rate_limits_shared": "the rate limiter's Redis is connected at start",
    "telemetry": "the exporter is started with the process",
}


@dataclass(slots=True)
class ReloadResult:
    """What a reload did: ``applied`` (else ``reason`` says why it was refused), the
    generation now serving, what was kept as it was, the seconds it took, and the
    requests still running on older generations when it swapped."""

    applied: bool
    generation: int
    reason: str = ""
    kept: list[str] = field(default_factory=list)
    seconds: float = 0.0
    draining: int = 0
    at: float = field(default_factory=time.time)

    def as_dict(self) -> dict:
        return {
            "applied": self.applied,
            "generation": self.generation,
            "reason": self.reason,
            "needs_restart": self.kept,
            "seconds": round(self.seconds, 6),
            "in_flight_on_previous": self.draining,
            "at": self.at,
        }


class ReloadLog:
    """The reloads of this process: counts for ``/metrics``, the last one for
    ``/healthz?details``."""

    def __init__(self) -> None:
        self.applied = 0
        self.refused = 0
        self.last: ReloadResult | None = None

    def add(self, result: ReloadResult) -> None:
        if result.applied:
            self.applied += 1
        else:
            self.refused += 1
        self.last = result


class ReloadCollector:
    """The reloads on ``/metrics``: ``prefixgate_config_generation``,
    ``prefixgate_config_reloads_total{result}``, ``prefixgate_config_last_reload_seconds``
    and the requests still running on retired generations."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        gw = self.gw
        g = GaugeMetricFamily("prefixgate_config_generation", "The config generation serving.")
        g.add_metric([], gw.live.generation)
        yield g
        c = CounterMetricFamily(
            "prefixgate_config_reloads", "Config reloads, by result.", labels=("result",)
        )
        c.add_metric(["applied"], gw.reloads.applied)
        c.add_metric(["refused"], gw.reloads.refused)
        yield c
        last = gw.reloads.last
        g = GaugeMetricFamily(
            "prefixgate_config_last_reload_seconds", "Seconds the last applied reload took."
        )
        g.add_metric([], last.seconds if last is not None and last.applied else 0.0)
        yield g
        g = GaugeMetricFamily(
            "prefixgate_config_draining_requests",
            "Requests still running on a config a reload replaced.",
        )
        g.add_metric([], sum(live.inflight for live in gw.retired_generations()))
        yield g


def config_state(gw: Gateway) -> dict:
    """The generation serving, since when, the requests still on older ones, and the
    last reload (for ``/healthz?details``)."""
    last = gw.reloads.last
    return {
        "generation": gw.live.generation,
        "loaded_at": gw.live.loaded_at,
        "reloads": {"applied": gw.reloads.applied, "refused": gw.reloads.refused},
        "last_reload": last.as_dict() if last is not None else None,
    }


def check(config: Config) -> None:
    """What a running gateway refuses beyond the file's own validation: a key or admin key
    whose environment variable is not set, and a config without keys on an address other
    than loopback (it would open the gateway to anyone)."""
    try:
        config.admin_digest()
        for key in config.keys:
            key.digest()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if config.open_access and config.server.host not in LOOPBACK:
        raise ConfigError(
            f"no API keys and the gateway listens on {config.server.host}: "
            "a reload would open it to anyone"
        )


def keep_fixed(old: Config, new: Config) -> tuple[Config, list[str]]:
    """``new`` with what cannot change live taken from ``old``, and a line for each such
    difference (``server.port: needs a restart (…)``)."""
    update: dict = {}
    kept: list[str] = []
    for name, why in FIXED.items():
        before, after = getattr(old, name), getattr(new, name)
        if before != after:
            update[name] = before
            kept.extend(f"{path}: needs a restart ({why})" for path in _diff(name, before, after))
    if new.budgets.shared != old.budgets.shared:
        update["budgets"] = new.budgets.model_copy(update={"shared": old.budgets.shared})
        kept.append("budgets.shared: needs a restart (the budgets' Redis is connected at start)")
    channels = []
    previous = {c.name: c for c in old.channels}
    for ch in new.channels:
        was = previous.get(ch.name)
        events = was.kv_events if was is not None else None
        if ch.kv_events != events:
            kept.append(
                f"channels[{ch.name}].kv_events: needs a restart (the engines' event "
                "subscriptions are opened at start)"
            )
            ch = ch.model_copy(update={"kv_events": events})
        channels.append(ch)
    update["channels"] = tuple(channels)
    return new.model_copy(update=update), kept


def _diff(name: str, before, after) -> list[str]:
    """The changed fields of a section (``server.port``), or the section's name."""
    if before is None or after is None or not isinstance(before, BaseModel):
        return [name]
    return [
        f"{name}.{f}" for f in type(before).model_fields if getattr(before, f) != getattr(after, f)
    ] or [name]


async def reload_gateway(gw: Gateway, config: Config) -> ReloadResult:
    """Swap ``gw`` onto ``config``; a config :func:`check` refuses leaves the old one
    serving."""
    t0 = time.perf_counter()
    old = gw.live
    try:
        check(config)
        effective, kept = keep_fixed(old.config, config)
        new = _build(gw, effective, old)
    except (ConfigError, ValueError) as exc:
        result = ReloadResult(False, old.generation, reason=str(exc))
        gw.reloads.add(result)
        log.error("reload refused, generation %d keeps serving: %s", old.generation, exc)
        return result
    try:
        await new.router.start()
    except Exception as exc:  # e.g. a routing.shared Redis that cannot be reached
        await new.router.aclose()
        result = ReloadResult(False, old.generation, reason=f"cannot start routing: {exc}")
        gw.reloads.add(result)
        log.error("reload refused, generation %d keeps serving: %s", old.generation, exc)
        return result
    if new.budgets is not None and old.budgets is None and effective.store is not None:
        from prefixgate.services import seed_budgets

        await seed_budgets(new.budgets, effective.store)
    gw.live = new  # the swap: requests from now on run on the new generation
    old.retired = True
    gw.draining.add(old)
    result = ReloadResult(
        True, new.generation, kept=kept, seconds=time.perf_counter() - t0, draining=old.inflight
    )
    gw.reloads.add(result)
    if old.inflight == 0:
        gw.close_generation(old)
    _learn_orders(gw, old.config, effective)
    log.info(
        "reloaded: generation %d serves (%.1f ms)%s; %d requests finish on generation %d",
        new.generation,
        result.seconds * 1000,
        "".join(f"; {k}" for k in kept),
        old.inflight,
        old.generation,
    )
    return result


def _build(gw: Gateway, config: Config, old: Live) -> Live:
    from prefixgate.live import Live

    new = Live.build(
        config, upstream=gw.upstream, events=gw.events, orders=gw.render_orders, previous=old
    )
    limit = getattr(gw.upstream, "limit", None)  # (a test's fake transport has none)
    for ch in config.channels:
        for url in ch.urls() if limit is not None else ():
            limit(
                url,
                max_connections=ch.max_connections or ch.max_in_flight,
                keepalive=ch.keepalive,
                channel=ch.name,
            )
    gw.admission.reconfigure(config.channels)
    return new


async def close_generation(gw: Gateway, old: Live) -> None:
    """A retired generation whose last request ended: its router's probes and shared
    state, its budget keeper when nothing took over its counters, and the upstream
    connections of the replicas no current generation routes to."""
    gw.draining.discard(old)
    await old.router.aclose()
    keeper = old.budgets
    if keeper is not None:
        current = gw.live.budgets
        if current is not None and current.counters is keeper.counters:
            if keeper._tasks:
                await asyncio.wait(list(keeper._tasks), timeout=5.0)
        else:
            await keeper.aclose()
    retire = getattr(gw.upstream, "retire", None)
    kept = {(ch.name, url) for ch in gw.live.config.channels for url in ch.urls()}
    for ch in old.config.channels:
        for url in ch.urls():
            if (ch.name, url) not in kept and retire is not None:
                closed = retire(url, channel=ch.name)
                log.info(
                    "channel %s: replica %s left (%d idle connections closed)", ch.name, url, closed
                )


def _learn_orders(gw: Gateway, old: Config, new: Config) -> None:
    """Learn the chat template's order of the channels a reload added or moved."""
    before = {(c.name, c.base_url) for c in old.channels}
    fresh = [c for c in new.channels if (c.name, c.base_url) not in before]
    if fresh:
        gw.spawn(gw.render_orders.learn_all(fresh, gw.upstream))


__all__ = [
    "FIXED",
    "ReloadLog",
    "ReloadResult",
    "check",
    "config_state",
    "keep_fixed",
    "reload_gateway",
]
