from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefixgate.config import parse_config
from prefixgate.server import create_app
from prefixgate.serving import ServerThread
from tests.fakes import ScriptedUpstream

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
FIXTURES = SHARED / "fixtures" / "claude-code"


class ListRecorder:
    def __init__(self) -> None:
        self.records = []

    def submit(self, record) -> None:
        self.records.append(record)


@pytest.fixture
def upstream():
    fake = ScriptedUpstream()
    with ServerThread(fake.app) as srv:
        fake.url = srv.url + "/v1"
        yield fake


@pytest.fixture
def gateway(upstream):
    """Start a gateway in front of the scripted upstream: ``gateway(**config)`` → handle
    with ``.url`` and ``.records``. Keyword overrides merge into the channel config."""
    started = []

    def start(channel: dict | None = None, **top) -> GatewayHandle:
        ch = {"name": "main", "kind": "openai", "base_url": upstream.url, **(channel or {})}
        raw = {"channels": [ch], "store": None, **top}
        if "channels" in top:
            raw["channels"] = top["channels"]
        config = parse_config(raw)
        rec = ListRecorder()
        srv = ServerThread(create_app(config, recorder=rec)).start()
        started.append(srv)
        return GatewayHandle(srv.url, rec, upstream)

    yield start
    for s in started:
        s.stop()


class GatewayHandle:
    def __init__(self, url: str, recorder: ListRecorder, upstream: ScriptedUpstream) -> None:
        self.url = url
        self.recorder = recorder
        self.upstream = upstream

    @property
    def records(self):
        return self.recorder.records


def load_fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def fixture_names() -> list[str]:
    return sorted(p.name for p in FIXTURES.glob("*.json"))
