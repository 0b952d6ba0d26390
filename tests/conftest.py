from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from prefixgate.config import parse_config
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from tests.fakes import ScriptedUpstream

# Test data kept in the repository (tests/fixtures/PROVENANCE.md says where each came from).
FIXTURE_ROOT = Path(__file__).resolve().parent / "fixtures"
FIXTURES = FIXTURE_ROOT / "claude-code"


def captured_alike(lending, walking, a, b) -> list[tuple[list, list]]:
    """Assert that two captures (``record/capture.py``'s ``Capturer``: one going on from
    each session's previous turn, one walking every request whole) gave their records
    ``a`` and ``b`` the same segments and change, and keep the same requests in the same
    bytes; their kept requests, session by session, for more checks."""
    assert (a.segments_in, a.segments_out, a.compared, a.change) == (
        b.segments_in, b.segments_out, b.compared, b.change,
    )  # fmt: skip
    assert lending.changes.bytes == walking.changes.bytes
    pairs = list(
        zip(lending.changes._sessions.values(), walking.changes._sessions.values(), strict=True)
    )
    for x, y in pairs:
        assert [(c.into, c.out, c.size, c.tokens(), c.marks()) for c in x] == [
            (c.into, c.out, c.size, c.tokens(), c.marks()) for c in y
        ]
    return pairs


def settled(gateway, limit: float = 10.0) -> None:
    """Until every request the gateway has taken is recorded: an answer's record is
    submitted just after its last byte went out, so a client may be a moment ahead."""
    deadline = time.monotonic() + limit
    while gateway.open_records:
        if time.monotonic() > deadline:
            raise AssertionError(f"{gateway.open_records} requests never recorded")
        time.sleep(0.001)


class ListRecorder:
    def __init__(self) -> None:
        self.records = []

    def submit(self, record) -> None:
        self.records.append(record)


# httpx's client, and the fork of it the official SDKs are built on.
_SYNC_CLIENTS: tuple[type, ...] = (httpx.Client,)
with contextlib.suppress(ImportError):
    import httpx2

    _SYNC_CLIENTS += (httpx2.Client,)


@pytest.fixture(autouse=True)
def _close_http_clients() -> Iterator[None]:
    """Every synchronous HTTP client a test makes (the official SDKs' included) is closed
    when the test ends. A client left open keeps its keep-alive socket until the garbage
    collector finds the client's reference cycle, at a moment of its choosing: the socket's
    ResourceWarning (an error in this suite) was then charged to whichever later test was
    running. Clients made by wider-scoped fixtures are made before this fixture and kept."""
    made: list = []

    def recording(init):
        def record(self, *args, **kwargs) -> None:
            init(self, *args, **kwargs)
            made.append(self)

        return record

    with pytest.MonkeyPatch.context() as patch:
        for cls in _SYNC_CLIENTS:
            patch.setattr(cls, "__init__", recording(cls.__init__))
        yield
    for client in made:
        client.close()


@contextlib.contextmanager
def scripted_upstream() -> Iterator[ScriptedUpstream]:
    """A :class:`ScriptedUpstream` served on loopback; its ``url`` ends in ``/v1``."""
    fake = ScriptedUpstream()
    with ServerThread(fake.app) as srv:
        fake.url = srv.url + "/v1"
        yield fake


@pytest.fixture
def upstream():
    with scripted_upstream() as fake:
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
        app = create_app(config, recorder=rec)
        srv = ServerThread(app).start()
        started.append(srv)
        return GatewayHandle(srv.url, rec, upstream, app.state.gateway)

    yield start
    for s in started:
        s.stop()


class GatewayHandle:
    def __init__(
        self, url: str, recorder: ListRecorder, upstream: ScriptedUpstream, gateway
    ) -> None:
        self.url = url
        self.recorder = recorder
        self.upstream = upstream
        self.gateway = gateway

    @property
    def records(self):
        settled(self.gateway)
        return self.recorder.records


def load_fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def fixture_names() -> list[str]:
    return sorted(p.name for p in FIXTURES.glob("*.json"))


# -- PostgreSQL: the real server on 127.0.0.1:5432; its tests fail, never skip, without it --
ADMIN_DSN = os.environ.get("PREFIXGATE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def with_uri(dsn: str, *, dbname: str | None = None, **query: str) -> str:
    """A copy of a postgresql:// URI with another database and/or extra query params."""
    parts = urllib.parse.urlsplit(dsn)
    path = f"/{dbname}" if dbname is not None else parts.path
    q = urllib.parse.parse_qsl(parts.query) + list(query.items())
    return urllib.parse.urlunsplit(parts._replace(path=path, query=urllib.parse.urlencode(q)))


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A uniquely named database for this test session, dropped at the end."""
    name = f"prefixgate_test_{secrets.token_hex(6)}"
    with psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_uri(ADMIN_DSN, dbname=name)
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_schema_dsn(database_dsn: str) -> str:
    """A fresh, empty schema in the session database, as a DSN whose search_path is it."""
    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return with_uri(database_dsn, options=f"-csearch_path={schema}")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_dsn(request, tmp_path) -> str:
    """A fresh store for one test, on each backend: a SQLite file, or a new schema in the
    session's Postgres database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'r.db'}"
    return pg_schema_dsn(request.getfixturevalue("pg_database"))
