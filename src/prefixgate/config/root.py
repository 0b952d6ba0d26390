"""The whole file: its sections and the checks that span several of them."""

from __future__ import annotations

import os

from pydantic import model_validator

from prefixgate.config.channel import ChannelConfig
from prefixgate.config.common import Model, hash_key
from prefixgate.config.keys import KeyConfig
from prefixgate.config.routing import nest_flat_keys, warn_flat_keys
from prefixgate.config.server import DashboardConfig, Limits, ServerConfig, TelemetryConfig
from prefixgate.config.spend import BudgetsConfig, PricesConfig, check_spend
from prefixgate.config.store import StoreConfig


class Config(Model):
    server: ServerConfig = ServerConfig()
    channels: tuple[ChannelConfig, ...]
    keys: tuple[KeyConfig, ...] = ()
    admin_key_sha256: str | None = None
    admin_key_env: str | None = None
    store: StoreConfig | None = StoreConfig()
    limits: Limits = Limits()
    dashboard: DashboardConfig = DashboardConfig()
    embedded_upstream: bool = False  # start the simulated upstream in-process
    store_keys: bool = False  # also accept keys managed in the store (`prefixgate keys create`)
    rate_limits_shared: str | None = None  # redis://… : limits shared by several gateways
    prices: PricesConfig | None = None  # cost per request (spend/prices.py)
    budgets: BudgetsConfig = BudgetsConfig()
    telemetry: TelemetryConfig | None = None  # OpenTelemetry export, off by default

    @model_validator(mode="before")
    @classmethod
    def _flat_keys(cls, raw: object) -> object:
        """The channels' flat routing and health keys nested, with one warning for all."""
        if not isinstance(raw, dict) or not isinstance(raw.get("channels"), list | tuple):
            return raw
        channels, moved = [], []
        for i, ch in enumerate(raw["channels"]):
            ch, lines = nest_flat_keys(ch)
            name = ch.get("name", i) if isinstance(ch, dict) else i
            moved += [f"channels[{name}].{line}" for line in lines]
            channels.append(ch)
        warn_flat_keys(moved)
        return {**raw, "channels": channels}

    @model_validator(mode="after")
    def _check(self) -> Config:
        names = [c.name for c in self.channels]
        if len(set(names)) != len(names):
            raise ValueError("channel names must be unique")
        if not self.channels:
            raise ValueError("at least one channel is needed")
        if self.store_keys and self.store is None:
            raise ValueError("store_keys needs a store")
        check_spend(self)
        return self

    @property
    def budgets_shared(self) -> str | None:
        return self.budgets.shared or self.rate_limits_shared

    @property
    def open_access(self) -> bool:
        """No keys configured: any key is accepted (loopback only)."""
        return not self.keys and not self.store_keys

    def admin_digest(self) -> str | None:
        if self.admin_key_sha256:
            return self.admin_key_sha256.lower()
        if self.admin_key_env and os.environ.get(self.admin_key_env):
            return hash_key(os.environ[self.admin_key_env])
        return None
