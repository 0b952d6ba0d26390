"""One upstream service as the config names it (``channels:``): its kind, its replicas,
how the gateway reaches them and what it changes in the requests it sends them."""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from prefixgate.config.common import Model, no_userinfo
from prefixgate.config.kv_events import KvEventsConfig
from prefixgate.config.routing import HealthConfig, RoutingConfig, nest_flat_keys, warn_flat_keys

ThinkingMap = Literal["chat_template_kwargs", "reasoning_effort", "drop"]
RenderOrder = Literal["tools_first", "system_first", "auto"]


class Timeouts(Model):
    connect: float = 10.0
    first_byte: float = 600.0
    idle: float = 300.0


class TLSConfig(Model):
    """How a channel's ``https://`` upstream is verified and whom it sees: a CA bundle
    (PEM) instead of the system's, a client certificate and key (mutual TLS), and, for a
    test bench only, ``verify: false``."""

    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    verify: bool = True

    @model_validator(mode="after")
    def _files(self) -> TLSConfig:
        if self.client_key and not self.client_cert:
            raise ValueError("tls.client_key needs tls.client_cert")
        for name in ("ca_bundle", "client_cert", "client_key"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ValueError(f"tls.{name}: no such file: {path}")
        return self

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_bundle)
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.client_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx


class ChannelConfig(Model):
    name: str
    kind: Literal["openai", "anthropic"] = "openai"
    base_url: str
    replicas: tuple[str, ...] = ()
    api_key_env: str | None = None
    models: tuple[str, ...] = ()
    model_map: dict[str, str] = Field(default_factory=dict)
    priority: int = 0
    weight: int = Field(default=1, ge=1)
    timeouts: Timeouts = Timeouts()
    tls: TLSConfig | None = None
    strip_anthropic_billing_header: bool | None = None
    anthropic_messages_exclude_cache: bool = True
    thinking: ThinkingMap = "chat_template_kwargs"
    history_thinking: Literal["reasoning_content", "drop"] = "reasoning_content"
    render_order: RenderOrder = "auto"  # auto: learned from the upstream (engine/order.py)
    # Later system messages delivered inside the client's turns (hygiene/system_in_place.py):
    # auto: where the upstream's template was seen to move them to the head.
    system_in_place: bool | Literal["auto"] = "auto"
    # How /v1/responses reaches this channel: converted to Chat Completions (any
    # OpenAI-compatible server), or passed through to the upstream's own /responses.
    responses_api: Literal["convert", "passthrough"] = "convert"
    # Whether the upstream's model takes images; false: a request holding one is refused
    # (400) before anything is sent.
    accepts_images: bool = True
    # The engine's prompt, for the KV events and `routing.policy: precise` (events/tokens.py): its
    # chat template (a .jinja file or tokenizer_config.json; unset: the simulated upstream's
    # format in render_order) and its tokenizer ("approx", or "hf:PATH" to tokenizer.json).
    chat_template: str | None = None
    tokenizer: str = "approx"
    capture_text: bool = False
    metrics_url: str | None = None
    routing: RoutingConfig = RoutingConfig()  # replica choice (docs/routing.md)
    health: HealthConfig = HealthConfig()  # the replicas' active probe
    kv_events: KvEventsConfig | None = None  # the engines' KV-cache events (events/)
    # Per worker (admission.py, upstream/http1.py): requests in flight to this channel (None:
    # only the worker's cap), open upstream connections (None: the channel's in-flight cap,
    # else the worker's: never the one that binds), and how long an idle upstream connection
    # is kept (below the upstream's own keep-alive: uvicorn, vLLM's server, closes at 5 s).
    max_in_flight: int | None = Field(default=None, ge=1)
    max_connections: int | None = Field(default=None, ge=1)
    keepalive: float = Field(default=4.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _flat_keys(cls, raw: object) -> object:
        # A channel built alone; in a whole config, Config moved them (and warned) first.
        raw, moved = nest_flat_keys(raw)
        warn_flat_keys(moved)
        return raw

    @model_validator(mode="after")
    def _kv_events(self) -> ChannelConfig:
        if self.kv_events is not None:
            self.kv_events.endpoints_for(self.urls())
        elif self.routing.policy == "precise":
            raise ValueError(
                "routing.policy: precise needs kv_events (the engines' KV-cache events)"
            )
        return self

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, v: str) -> str:
        kind, sep, path = v.partition(":")
        if v != "approx" and not (kind == "hf" and sep and path):
            raise ValueError("tokenizer must be 'approx' or 'hf:PATH' (a tokenizer.json)")
        if kind == "hf" and not Path(path).exists():
            raise ValueError(f"tokenizer: no such file: {path}")
        return v

    @field_validator("chat_template")
    @classmethod
    def _chat_template(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_file():
            raise ValueError(f"chat_template: no such file: {v}")
        return v

    @field_validator("base_url")
    @classmethod
    def _strip_slash(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://")
        return no_userinfo(v).rstrip("/")

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(no_userinfo(u) for u in v)

    @field_validator("metrics_url")
    @classmethod
    def _metrics_url(cls, v: str | None) -> str | None:
        return None if v is None else no_userinfo(v)

    @property
    def strip_billing_header(self) -> bool:
        if self.kind == "anthropic":
            return False  # never: the vendor's own API uses the header
        return (
            True
            if self.strip_anthropic_billing_header is None
            else self.strip_anthropic_billing_header
        )

    def serves(self, model: str) -> bool:
        return not self.models or model in self.models or model in self.model_map

    def upstream_model(self, model: str) -> str:
        return self.model_map.get(model, model)

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def urls(self) -> tuple[str, ...]:
        return (self.base_url, *(u.rstrip("/") for u in self.replicas))
