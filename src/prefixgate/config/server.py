"""The serving side (``server:``, ``limits:``, ``dashboard:``, ``telemetry:``): the
listening socket and its edge, admission, the request size limits, the dashboard's
sessions and the OpenTelemetry export."""

from __future__ import annotations

import ipaddress

from pydantic import Field, field_validator

from prefixgate.config.common import Model, no_userinfo


class Limits(Model):
    max_body_bytes: int = 32 * 1024 * 1024
    max_json_depth: int = 64
    max_messages: int = 10_000
    max_tools: int = 1_000
    max_blocks: int = 100_000
    max_header_bytes: int = 64 * 1024


class ServerConfig(Model):
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


class DashboardConfig(Model):
    """The dashboard's admin sessions (web/login.py). A session ends after
    ``session_idle_seconds`` without a request, and ``session_max_seconds`` after its login
    whatever the activity; ``login_attempts_per_minute`` bounds the login form per client
    address (429 beyond). ``secure_cookie``: None marks the cookie Secure when the request
    came over TLS; true always (a TLS-terminating proxy in front), false never."""

    session_idle_seconds: float = Field(default=3600.0, gt=0)
    session_max_seconds: float = Field(default=12 * 3600.0, gt=0)
    login_attempts_per_minute: int = Field(default=5, ge=1)
    secure_cookie: bool | None = None


class TelemetryConfig(Model):
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
