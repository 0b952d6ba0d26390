"""The configuration file (YAML), parsed once into typed, validated settings.

See ``examples/prefixgate.yaml`` for a commented example. Secrets never live in the file in
clear: client API keys are given as SHA-256 digests (``prefixgate keys hash``) or read from
an environment variable and hashed at load time; upstream keys come from the environment.

One module per part of the file: ``channel`` (``channels:``), ``routing`` (a channel's
``routing:`` and ``health:``), ``kv_events`` (a channel's ``kv_events:``), ``keys``,
``store``, ``server`` (``server:``, ``limits:``, ``dashboard:``, ``telemetry:``), ``spend``
(``prices:``, ``budgets:``), ``root`` (the whole file) and ``load`` (reading it). The
package imports nothing of the gateway's: the rest of it imports the package.
"""

from prefixgate.config.channel import ChannelConfig, RenderOrder, ThinkingMap, Timeouts, TLSConfig
from prefixgate.config.common import hash_key, no_userinfo
from prefixgate.config.keys import KeyConfig
from prefixgate.config.kv_events import KvEventsConfig, KvEventsEndpoint
from prefixgate.config.load import LOOPBACK, ConfigError, load_config, parse_config, quick_config
from prefixgate.config.root import Config
from prefixgate.config.routing import HealthConfig, RoutingConfig, RoutingPolicy
from prefixgate.config.server import DashboardConfig, Limits, ServerConfig, TelemetryConfig
from prefixgate.config.spend import BudgetsConfig, PriceConfig, PricesConfig
from prefixgate.config.store import StoreConfig

__all__ = [
    "LOOPBACK",
    "BudgetsConfig",
    "ChannelConfig",
    "Config",
    "ConfigError",
    "DashboardConfig",
    "HealthConfig",
    "KeyConfig",
    "KvEventsConfig",
    "KvEventsEndpoint",
    "Limits",
    "PriceConfig",
    "PricesConfig",
    "RenderOrder",
    "RoutingConfig",
    "RoutingPolicy",
    "ServerConfig",
    "StoreConfig",
    "TLSConfig",
    "TelemetryConfig",
    "ThinkingMap",
    "Timeouts",
    "hash_key",
    "load_config",
    "no_userinfo",
    "parse_config",
    "quick_config",
]
