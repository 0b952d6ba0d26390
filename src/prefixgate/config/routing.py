"""How a channel picks a replica (``routing:``, docs/routing.md) and probes its replicas'
health (``health:``).

The flat keys these sections replace (``routing: prefix`` as a string,
``routing_balance_abs``, ``health_check_interval``...) are still read: :func:`nest_flat_keys`
moves them into the sections, and the config that used them loads with one warning naming
the new keys.
"""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import Field

from prefixgate.config.common import Model, RedisUrl

log = logging.getLogger("prefixgate.config")

RoutingPolicy = Literal["round_robin", "least_busy", "session", "prefix", "precise"]


class RoutingConfig(Model):
    """The replica choice. The thresholds are SGLang cache_aware's defaults."""

    policy: RoutingPolicy = "session"
    block_size: int = Field(default=16, ge=1)
    match_threshold: float = Field(default=0.3, ge=0.0, le=1.0)
    balance_abs: int = Field(default=64, ge=0)
    balance_rel: float = Field(default=1.5, ge=1.0)
    lru_blocks: int = Field(default=65536, ge=1)  # per replica
    shared: RedisUrl | None = None  # redis://host:6379/0: share the routing state
    shared_ttl: float = Field(default=3600.0, gt=0)


class HealthConfig(Model):
    """The active probe: ``GET {base URL minus /v1}{path}`` every ``interval`` seconds
    (None: no active probe, the passive checks only), answered within ``timeout``."""

    interval: float | None = Field(default=None, gt=0)
    path: str = "/health"
    timeout: float = Field(default=2.0, gt=0)


# Each flat key and where it now lives. ``routing`` itself was the policy, a string.
FLAT_KEYS = {
    **{f"routing_{f}": ("routing", f) for f in RoutingConfig.model_fields if f != "policy"},
    "health_check_interval": ("health", "interval"),
    "health_path": ("health", "path"),
    "health_timeout": ("health", "timeout"),
}


def nest_flat_keys(raw: object) -> tuple[object, list[str]]:
    """A channel's raw settings with the flat keys moved into their sections, and a
    ``old → new`` line for each moved key. A key given both ways is an error."""
    if not isinstance(raw, dict):
        return raw, []
    moved: list[str] = []
    out = dict(raw)
    if isinstance(out.get("routing"), str):
        out["routing"] = {"policy": out["routing"]}
        moved.append("routing → routing.policy")
    for old, (section, field) in FLAT_KEYS.items():
        if old not in out:
            continue
        nested = out.get(section, {})
        if not isinstance(nested, dict):
            continue  # left for the section's own error
        nested = dict(nested)
        if field in nested:
            raise ValueError(f"{old} and {section}.{field} both given: keep {section}.{field}")
        nested[field] = out.pop(old)
        out[section] = nested
        moved.append(f"{old} → {section}.{field}")
    return out, moved


def warn_flat_keys(moved: list[str]) -> None:
    """The one warning of a config that used flat keys, naming the new ones."""
    if moved:
        log.warning(
            "config: flat routing and health keys are deprecated; nest them under routing: "
            "and health: (%s)",
            ", ".join(moved),
        )
