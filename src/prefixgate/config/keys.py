"""Client API keys (``keys:``): given as SHA-256 digests (``prefixgate keys hash``) or
read from an environment variable and hashed at load time, never in clear in the file."""

from __future__ import annotations

import os

from pydantic import Field, model_validator

from prefixgate.config.common import Model, hash_key


class KeyConfig(Model):
    name: str
    owner: str | None = None
    key_sha256: str | None = None
    key_env: str | None = None
    models: tuple[str, ...] = ()  # empty: every model
    capture_text: bool = False
    rpm: int | None = Field(default=None, ge=1)  # requests per minute
    tpm: int | None = Field(default=None, ge=1)  # prompt + completion tokens per minute
    max_concurrency: int | None = Field(default=None, ge=1)  # requests in flight
    budgets: tuple[str, ...] = ()  # "2M tokens/day", "50 USD/month" (spend/budgets.py)

    @model_validator(mode="after")
    def _one_source(self) -> KeyConfig:
        if bool(self.key_sha256) == bool(self.key_env):
            raise ValueError(f"key {self.name!r}: give exactly one of key_sha256 or key_env")
        return self

    def digest(self) -> str:
        if self.key_sha256:
            return self.key_sha256.lower()
        value = os.environ.get(self.key_env or "")
        if not value:
            raise ValueError(f"key {self.name!r}: environment variable {self.key_env} is not set")
        return hash_key(value)

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models
