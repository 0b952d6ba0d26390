"""Fixtures for the dashboard: the demo's stores (the incident and the fix), filled once per
session by the real demo, and the gateway app with ``/dashboard`` served over loopback."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from prefixgate.config import parse_config
from prefixgate.gateway import NullRecorder
from prefixgate.lab import incident
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from prefixgate.web import dashboard_routes

ADMIN_KEY = "dashboard-admin-test-key"
SPARE_REPLICA = "http://127.0.0.1:9/v1"  # configured, never used by the demo

# One cumulative /metrics snapshot of a vLLM whose host-memory tier is write-only.
WRITE_ONLY_METRICS = """\
# TYPE vllm:kv_offload_total_bytes counter
vllm:kv_offload_total_bytes_total{model_name="m",transfer_type="GPU_to_CPU"} 2.6e10
vllm:kv_offload_total_bytes_total{model_name="m",transfer_type="CPU_to_GPU"} 0
# TYPE vllm:external_prefix_cache_queries counter
vllm:external_prefix_cache_queries_total{model_name="m"} 7e5
# TYPE vllm:external_prefix_cache_hits counter
vllm:external_prefix_cache_hits_total{model_name="m"} 0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 2e6
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 1.7e6
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="64",model_name="m"} 1.0
"""


@contextlib.contextmanager
def _no_progress(name, total):
    yield lambda: None


@dataclass(frozen=True)
class DemoStores:
    incident: str  # DSN of the phase with the billing header kept
    fixed: str  # DSN of the phase with it stripped
    replica: str  # the upstream URL the demo recorded


@pytest.fixture(scope="session")
def demo_stores(tmp_path_factory) -> DemoStores:
    path = tmp_path_factory.mktemp("web") / "prefixgate-demo.db"
    kept, stripped = incident.run_demo(
        sessions=4, turns=8, store_path=str(path), progress_factory=_no_progress
    )
    with open_store(kept.dsn) as store:
        [(replica,)] = store.query("SELECT MAX(replica) FROM requests")
    return DemoStores(kept.dsn, stripped.dsn, replica)


def dashboard_app(
    dsn: str,
    replica: str,
    *,
    admin_key: str | None = None,
    metrics_url: str | None = None,
    dashboard: dict | None = None,
    kv_events: dict | None = None,
) -> Starlette:
    """The gateway app configured like the demo's, with the dashboard mounted (by
    ``create_app`` once server.py mounts it; here otherwise); ``dashboard`` is the config's
    ``dashboard:`` section, ``kv_events`` the channel's."""
    channel = {
        "name": "h200-vllm",
        "kind": "openai",
        "base_url": replica,
        "replicas": [SPARE_REPLICA],
        "models": [incident.MODEL],
        "model_map": {incident.MODEL: incident.UPSTREAM_MODEL},
    }
    if metrics_url:
        channel["metrics_url"] = metrics_url
    if kv_events:
        channel["kv_events"] = kv_events
    raw = {"channels": [channel], "store": {"dsn": dsn}}
    if admin_key:
        raw["admin_key_sha256"] = hashlib.sha256(admin_key.encode()).hexdigest()
    if dashboard:
        raw["dashboard"] = dashboard
    app = create_app(parse_config(raw), recorder=NullRecorder())
    if not any(getattr(r, "path", "") == "/dashboard" for r in app.routes):
        app.router.routes.extend(dashboard_routes(app.state.gateway, dsn))
    return app


@pytest.fixture(scope="session")
def metrics_url() -> Iterator[str]:
    app = Starlette(routes=[Route("/metrics", lambda r: PlainTextResponse(WRITE_ONLY_METRICS))])
    with ServerThread(app) as srv:
        yield srv.url + "/metrics"


@pytest.fixture(scope="session")
def dashboard(demo_stores: DemoStores, metrics_url: str) -> Iterator[str]:
    """Base URL of an open gateway (no admin key, loopback) over the incident's store."""
    app = dashboard_app(demo_stores.incident, demo_stores.replica, metrics_url=metrics_url)
    with ServerThread(app) as srv:
        yield srv.url


@pytest.fixture(scope="session")
def guarded_dashboard(demo_stores: DemoStores) -> Iterator[str]:
    """Base URL of a gateway with an admin key configured."""
    app = dashboard_app(demo_stores.incident, demo_stores.replica, admin_key=ADMIN_KEY)
    with ServerThread(app) as srv:
        yield srv.url


@pytest.fixture
def login_gateway(tmp_path) -> Iterator:
    """Start gateways with an admin key over a store of their own (a fresh SQLite file
    unless ``dsn`` is given), so login attempts are counted per test:
    ``login_gateway(dsn=None, admin_key=ADMIN_KEY, **dashboard_section)`` → base URL."""
    started: list[ServerThread] = []
    default_dsn = f"sqlite:///{tmp_path / 'sessions.db'}"

    def start(dsn: str | None = None, admin_key: str = ADMIN_KEY, **dashboard) -> str:
        app = dashboard_app(
            dsn or default_dsn, SPARE_REPLICA, admin_key=admin_key, dashboard=dashboard
        )
        srv = ServerThread(app).start()
        started.append(srv)
        return srv.url

    yield start
    for srv in started:
        srv.stop()
