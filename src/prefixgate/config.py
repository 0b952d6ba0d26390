"""The configuration file (YAML), parsed once into typed, validated settings.

See ``examples/prefixgate.yaml`` for a commented example. Secrets never live in the file in
clear: client API keys are given as SHA-256 digests (``prefixgate keys hash``) or read from
an environment variable and hashed at load time; upstream keys come from the environment.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import ssl
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from prefixgate.events.endpoints import Endpoints, check_endpoint, subscriber_endpoints

ThinkingMap = Literal["chat_template_kwargs", "reasoning_effort", "drop"]
RoutingPolicy = Literal["round_robin", "least_busy", "session", "prefix", "precise"]
RenderOrder = Literal["tools_first", "system_first", "auto"]


def _redis_url(v: str) -> str:
    if not v.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("must be a redis:// or rediss:// URL")
    return v


RedisUrl = Annotated[str, AfterValidator(_redis_url)]


def no_userinfo(url: str) -> str:
    """``url``, refused when it holds a user or password (``http://user:pass@host``): an
    upstream's URL is kept in every record, the journal, the dashboard and log lines, so
    it must hold no secret. The message never repeats the URL."""
    if "@" in urlsplit(url).netloc:
        raise ValueError(
            "a user or password in an upstream URL is refused (the URL is recorded and "
            "logged): put the key in an environment variable named by api_key_env"
        )
    return url


def hash_key(key: str) -> str:
    """The stored form of an API key."""
    return hashlib.sha256(key.encode()).hexdigest()


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Timeouts(_Model):
    connect: float = 10.0
    first_byte: float = 600.0
    idle: float = 300.0


class TLSConfig(_Model):
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


class KvEventsEndpoint(_Model):
    """One replica's event addresses, as given to its engine's ``--kv-events-config``."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str | None = None  # None: the section's

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _zmq_address(cls, v: str | None) -> str | None:
        return v if v is None else check_endpoint(v)


class KvEventsConfig(_Model):
    """The engines' KV-cache events (``events/``): where each replica publishes them.

    ``endpoint``/``replay_endpoint``/``topic`` are the engine's own settings; the gateway
    takes the other side (``events/endpoints.py``). A channel with several replicas gives
    ``replicas`` (one entry per URL, in the order base_url, replicas...), or an endpoint
    with ``*`` that each engine binds on its own host.
    """

    endpoint: str | None = None
    replay_endpoint: str | None = None
    topic: str = ""
    replicas: tuple[KvEventsEndpoint, ...] = ()
    block_size: int | None = Field(default=None, ge=1)  # None: the engines' own
    max_blocks: int = Field(default=200_000, ge=1)  # per replica and medium
    # removals remembered (with their times) per replica and medium, for the miss ledger
    history_blocks: int = Field(default=100_000, ge=1)
    stale_after: float = Field(default=30.0, gt=0)  # seconds
    replay_timeout: float = Field(default=2.0, gt=0)  # seconds

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _zmq_address(cls, v: str | None) -> str | None:
        return v if v is None else check_endpoint(v)

    def endpoints_for(self, urls: tuple[str, ...]) -> dict[str, Endpoints]:
        """The subscriber's side for each replica URL; ``ValueError`` if ambiguous."""
        if self.replicas:
            if len(self.replicas) != len(urls):
                raise ValueError(
                    f"kv_events.replicas has {len(self.replicas)} entries for {len(urls)} "
                    "replicas (base_url, then replicas, in order)"
                )
            items = [
                (url, r.endpoint, r.replay_endpoint, self.topic if r.topic is None else r.topic)
                for url, r in zip(urls, self.replicas, strict=True)
            ]
        elif self.endpoint is None:
            raise ValueError("kv_events needs an endpoint (or one per replica in replicas)")
        else:
            items = [(url, self.endpoint, self.replay_endpoint, self.topic) for url in urls]
        out = {url: subscriber_endpoints(ep, rep, topic, url) for url, ep, rep, topic in items}
        seen = [e.events for e in out.values()]
        if len(set(seen)) != len(seen):
            raise ValueError(
                "kv_events: two replicas would share one event address; give each replica "
                "its own endpoint (kv_events.replicas) or an endpoint with * on distinct hosts"
            )
        return out


class ChannelConfig(_Model):
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
    # The engine's prompt, for the KV events and `routing: precise` (events/tokens.py): its
    # chat template (a .jinja file or tokenizer_config.json; unset: the simulated upstream's
    # format in render_order) and its tokenizer ("approx", or "hf:PATH" to tokenizer.json).
    chat_template: str | None = None
    tokenizer: str = "approx"
    capture_text: bool = False
    metrics_url: str | None = None
    # Replica choice (docs/routing.md). The thresholds are SGLang cache_aware's defaults.
    routing: RoutingPolicy = "session"
    routing_block_size: int = Field(default=16, ge=1)
    routing_match_threshold: float = Field(default=0.3, ge=0.0, le=1.0)
    routing_balance_abs: int = Field(default=64, ge=0)
    routing_balance_rel: float = Field(default=1.5, ge=1.0)
    routing_lru_blocks: int = Field(default=65536, ge=1)  # per replica
    routing_shared: RedisUrl | None = None  # redis://host:6379/0: share the routing state
    routing_shared_ttl: float = Field(default=3600.0, gt=0)
    health_check_interval: float | None = Field(default=None, gt=0)  # None: no active probe
    health_path: str = "/health"
    health_timeout: float = Field(default=2.0, gt=0)
    kv_events: KvEventsConfig | None = None  # the engines' KV-cache events (events/)
    # Per worker (admission.py, upstream/http1.py): requests in flight to this channel (None:
    # only the worker's cap), open upstream connections (None: the channel's in-flight cap,
    # else the worker's: never the one that binds), and how long an idle upstream connection
    # is kept (below the upstream's own keep-alive: uvicorn, vLLM's server, closes at 5 s).
    max_in_flight: int | None = Field(default=None, ge=1)
    max_connections: int | None = Field(default=None, ge=1)
    keepalive: float = Field(default=4.0, gt=0)

    @model_validator(mode="after")
    def _kv_events(self) -> ChannelConfig:
        if self.kv_events is not None:
            self.kv_events.endpoints_for(self.urls())
        elif self.routing == "precise":
            raise ValueError("routing: precise needs kv_events (the engines' KV-cache events)")
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


class KeyConfig(_Model):
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


class StoreConfig(_Model):
    dsn: str = "sqlite:///prefixgate.db"
    retention_days: float | None = None
    capture_segments: bool = True
    # Memory for the sessions' latest requests, which each request is compared with to
    # find what breaks its prefix (record/changes.py); 0 turns the comparison off.
    change_memory_mb: float = Field(64.0, ge=0)
    # The miss ledger of each request (ledger/: where its prompt tokens went), computed
    # after the request, off its path, into the ``ledgers`` table.
    ledger: bool = True
    # The record journal (record/journal.py): a directory where each record is appended as
    # its answer completes, until the store has it; each process writes its own slot in
    # it. null: no journal (records wait for the store in memory; a crash loses them).
    journal_path: str | None = "prefixgate-journal"
    # Past this size the journal takes no more records (logged) until the store catches up.
    journal_max_mb: float = Field(default=1024.0, gt=0)
    # A stalled store is a failed store: a statement fails after statement_timeout, a lock
    # wait after lock_timeout (SQLite: its busy timeout); the writer retries later while
    # records wait in the journal. Seconds.
    statement_timeout: float = Field(default=5.0, gt=0)
    lock_timeout: float = Field(default=2.0, gt=0)
    # Shutdown gives the store at most this long to take what is pending; the rest stays
    # in the journal for the next start. Seconds.
    close_timeout: float = Field(default=5.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, raw: object) -> object:
        if isinstance(raw, dict) and "spool_path" in raw:
            raise ValueError(
                "spool_path is gone: records go to a journal directory, store.journal_path"
            )
        return raw

    @field_validator("dsn")
    @classmethod
    def _known_store(cls, v: str) -> str:
        # What store.open_store takes; said at start rather than at the first record.
        if not v.startswith(("postgresql://", "postgres://", "sqlite:")) and not v.endswith(
            (".db", ".sqlite", ".sqlite3")
        ):
            raise ValueError("want sqlite:///path.db, a .db path, or postgresql://…")
        return v


class Limits(_Model):
    max_body_bytes: int = 32 * 1024 * 1024
    max_json_depth: int = 64
    max_messages: int = 10_000
    max_tools: int = 1_000
    max_blocks: int = 100_000
    max_header_bytes: int = 64 * 1024


class ServerConfig(_Model):
    host: str = "127.0.0.1"
    port: int = 8787
    # After each socket event, keep polling for this long instead of sleeping (busypoll.py):
    # the next packet is read when it lands, not after the idle core wakes up. 0: off (the
    # default: it costs CPU while streams trickle; docs/performance.md has both figures).
    busy_poll_us: float = Field(default=0.0, ge=0, le=100_000)
    # At most this share of each second is spent polling.
    busy_poll_share: float = Field(default=0.5, gt=0, le=1)
    # The bounded edge (serve/edge.py), on both HTTP servers. A request head must arrive
    # within head_timeout s of its first byte; a body must not pause for body_timeout s and,
    # after its first body_timeout s, must average body_min_rate bytes/s (0: no floor).
    head_timeout: float = Field(default=30.0, gt=0)
    body_timeout: float = Field(default=30.0, gt=0)
    body_min_rate: float = Field(default=1024.0, ge=0)
    keepalive: float = Field(default=5.0, gt=0)  # s an idle connection is kept
    # Open client connections per process; past it, 503 in the route's error shape. Lowered
    # at start to what the open-file limit can serve.
    max_connections: int = Field(default=10_000, ge=1)
    # Admission (admission.py), per worker process: requests in flight; past it, up to
    # max_queued wait at most queue_timeout s for a slot, then get the protocol's overloaded
    # answer (529 on /v1/messages, 503 on OpenAI routes) with retry-after.
    max_in_flight: int = Field(default=2000, ge=1)
    max_queued: int = Field(default=1000, ge=0)
    queue_timeout: float = Field(default=5.0, ge=0)
    # New requests are refused as overloaded while the event loop runs this many seconds
    # late (its CPU is spent: every open stream waits as long), until it runs under half of
    # it again (admission.LagShed); null turns it off.
    shed_loop_lag: float | None = Field(default=0.25, gt=0)
    access_log: bool = False  # one log line per request (prefixgate.access)
    # Admin credential checks (admin_attempts.py): wrong admin keys a client address may
    # send a minute, and all addresses together, before 429 without a look at the key.
    admin_failures_per_minute: int = Field(default=10, ge=1)
    admin_failures_in_all_per_minute: int = Field(default=100, ge=1)
    # Proxies whose X-Forwarded-For names the client (addresses or CIDR blocks).
    trusted_proxies: list[str] = []
    # The event loop's pauses and each garbage collection's (loopwatch.py) as /metrics
    # histograms: a 100 Hz timer and a callback per collection, so opt-in.
    loop_watch: bool = False
    # On SIGTERM/SIGINT the port is handed to a successor (serve/handover.py), then the
    # requests in flight may run this many seconds to their end before they are cut.
    drain_timeout: float = Field(default=30.0, ge=0)

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        for spec in v:
            try:
                ipaddress.ip_network(spec, strict=False)
            except ValueError:
                raise ValueError(f"not an address or CIDR block: {spec!r}") from None
        return v


class DashboardConfig(_Model):
    """The dashboard's admin sessions (web/login.py). A session ends after
    ``session_idle_seconds`` without a request, and ``session_max_seconds`` after its login
    whatever the activity; ``login_attempts_per_minute`` bounds the login form per client
    address (429 beyond). ``secure_cookie``: None marks the cookie Secure when the request
    came over TLS; true always (a TLS-terminating proxy in front), false never."""

    session_idle_seconds: float = Field(default=3600.0, gt=0)
    session_max_seconds: float = Field(default=12 * 3600.0, gt=0)
    login_attempts_per_minute: int = Field(default=5, ge=1)
    secure_cookie: bool | None = None


class PriceConfig(_Model):
    """One price, in the table's currency per million tokens. ``cache_write`` (tokens an
    upstream reports written to its cache, as Anthropic's API does) costs ``input`` when
    not given."""

    input: float = Field(ge=0)
    cached_input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_write: float | None = Field(default=None, ge=0)


class PricesConfig(_Model):
    """Prices by the model the client asked for, and by channel (a channel's price covers
    every model it serves and wins over the model's). A request without a price has no
    cost (spend/prices.py)."""

    currency: str = Field(default="USD", pattern=r"^[A-Za-z]{2,8}$")
    models: dict[str, PriceConfig] = Field(default_factory=dict)
    channels: dict[str, PriceConfig] = Field(default_factory=dict)


class BudgetsConfig(_Model):
    """Budgets per owner (keys carry their own, ``keys[].budgets``) and how they are kept:
    ``shared`` (redis://…) shares them between gateways, as ``rate_limits_shared`` does
    (the default); without either each gateway keeps its own. A request is charged
    ``output_estimate`` output tokens (or its ``max_tokens``, when lower) before it goes
    upstream; a hold a gateway never settled (it died) lapses after ``hold_seconds``."""

    owners: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    shared: RedisUrl | None = None
    output_estimate: int = Field(default=1024, ge=0)
    hold_seconds: float = Field(default=3600.0, gt=0)


class TelemetryConfig(_Model):
    """OpenTelemetry export (telemetry.py): one span per request, OTLP over HTTP/protobuf
    to ``otlp_endpoint`` (the full URL, ``…/v1/traces``). Headers (an Authorization) come
    from the environment variable ``headers_env`` as ``name=value,name=value``, never from
    this file. ``sample_ratio`` of the traces are kept (a client's ``traceparent`` decides
    for its own)."""

    otlp_endpoint: str
    headers_env: str | None = None
    sample_ratio: float = Field(default=1.0, ge=0, le=1)
    service_name: str = "prefixgate"
    timeout: float = Field(default=5.0, gt=0)

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("otlp_endpoint must be an http:// or https:// URL")
        return no_userinfo(v)


class Config(_Model):
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

    @model_validator(mode="after")
    def _check(self) -> Config:
        names = [c.name for c in self.channels]
        if len(set(names)) != len(names):
            raise ValueError("channel names must be unique")
        if not self.channels:
            raise ValueError("at least one channel is needed")
        if self.store_keys and self.store is None:
            raise ValueError("store_keys needs a store")
        _check_spend(self)
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


def _check_spend(config: Config) -> None:
    """Prices for models no channel serves or channels that do not exist, and budgets that
    do not parse, are errors at start, not surprises on a bill."""
    from prefixgate.spend.budgets import BudgetSyntaxError, parse_budget

    prices = config.prices
    if prices is not None:
        names = {c.name for c in config.channels}
        for ch in prices.channels:
            if ch not in names:
                raise ValueError(
                    f"prices.channels.{ch}: no such channel (channels: {', '.join(sorted(names))})"
                )
        for model in prices.models:
            if not any(c.serves(model) for c in config.channels):
                served = sorted({m for c in config.channels for m in (*c.models, *c.model_map)})
                raise ValueError(
                    f"prices.models.{model}: no channel serves model {model!r} "
                    f"(served: {', '.join(served)})"
                )
    currency = prices.currency if prices is not None else "USD"
    lines = [(f"keys[{k.name}].budgets", b) for k in config.keys for b in k.budgets]
    lines += [(f"budgets.owners.{o}", b) for o, bs in config.budgets.owners.items() for b in bs]
    for where, text in lines:
        try:
            budget = parse_budget(text, currency)
        except BudgetSyntaxError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if budget.money and prices is None:
            raise ValueError(f"{where}: budget {text!r} is money: it needs a price table (prices:)")


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
