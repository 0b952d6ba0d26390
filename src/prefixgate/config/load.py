"""Reading the config: from a YAML file, from a dict, or the one-channel config of
``prefixgate serve --upstream URL``; every error said as ``path.to.key: message``."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from prefixgate.config.root import Config


class ConfigError(Exception):
    pass


def load_config(path: str | Path) -> Config:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    return parse_config(raw or {})


def parse_config(raw: dict) -> Config:
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()]
        raise ConfigError("invalid config:\n" + "\n".join(lines)) from None


LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def quick_config(
    upstream: str | None, model: str | None, host: str, port: int, store: str | None = None
) -> Config:
    """The config of ``prefixgate serve --upstream URL`` (no file): one openai channel."""
    channel: dict = {
        "name": "default",
        "kind": "openai",
        "base_url": upstream or "http://127.0.0.1:0/v1",
    }
    if model:
        channel["models"] = [model]
    return parse_config(
        {
            "server": {"host": host, "port": port},
            "channels": [channel],
            "store": {"dsn": store} if store else {},
            "embedded_upstream": upstream is None,
        }
    )
