"""The ``responses`` entry in the record, the doctor and the dashboard, on real traffic: a
Codex-shaped agent on ``/v1/responses`` whose developer message carries the time (a
volatile head), beside a stable agent on ``/v1/chat/completions``, through the gateway
(SQLite store, texts captured) in front of the simulated vLLM."""

from __future__ import annotations

import httpx
import pytest

from prefixgate.config import parse_config
from prefixgate.doctor import diagnose
from prefixgate.lab.upstream_sim import SimSettings, create_upstream_app
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from tests.web.conftest import dashboard_app

SESSIONS, TURNS = 6, 6
GUIDE = "Follow the repository's conventions; run the tests before you answer. " * 40
TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Runs a command. " * 30,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]


def _codex_session(client: httpx.Client, s: int) -> None:
    items: list = []
    for t in range(TURNS):
        developer = f"Current time: 2026-12-01 09:{t * 7:02d}:{s:02d}. {GUIDE}"
        head = [{"role": "developer", "content": [{"type": "input_text", "text": developer}]}]
        items.append({"role": "user", "content": [{"type": "input_text", "text": f"q{s}.{t}"}]})
        r = client.post(
            "/v1/responses",
            json={"model": "sim-model", "input": head + items, "tools": TOOLS, "store": False},
            headers={
                "user-agent": "codex_exec/0.171.0 (Debian 12.0.0; x86_64) xterm",
                "originator": "codex_exec",
                "session-id": f"codex-{s}",
            },
        )
        r.raise_for_status()
        items += r.json()["output"]


def _stable_session(client: httpx.Client, s: int) -> None:
    messages = [{"role": "system", "content": GUIDE}]
    for t in range(TURNS):
        messages.append({"role": "user", "content": f"q{s}.{t}"})
        r = client.post(
            "/v1/chat/completions",
            json={"model": "sim-model", "messages": messages, "user": f"stable-{s}"},
            headers={"user-agent": "opencode/1.18.33"},
        )
        r.raise_for_status()
        messages.append(
            {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}
        )


@pytest.fixture(scope="module")
def traffic(tmp_path_factory) -> tuple[str, str]:
    """The store's DSN and the upstream's URL, once the traffic is recorded."""
    tmp = tmp_path_factory.mktemp("responses-entry")
    dsn = f"sqlite:///{tmp / 'store.db'}"
    with ServerThread(create_upstream_app(SimSettings(block_size=64))) as up:
        config = parse_config(
            {
                "channels": [{"name": "sim", "base_url": up.url + "/v1", "capture_text": True}],
                "store": {"dsn": dsn, "journal_path": str(tmp / "journal")},
            }
        )
        with ServerThread(create_app(config)) as gw, httpx.Client(base_url=gw.url) as client:
            for s in range(SESSIONS):
                _codex_session(client, s)
                _stable_session(client, s)
        return dsn, up.url + "/v1"


def test_the_record_keeps_the_entry_the_session_and_both_sides(traffic):
    dsn, _ = traffic
    with open_store(dsn) as store:
        recs = [r for r in store.iter_records(with_texts=True) if r.endpoint == "responses"]
    assert len(recs) == SESSIONS * TURNS and {r.status for r in recs} == {200}
    rec = recs[-1]
    assert (rec.client, rec.session_kind) == ("codex_exec", "codex")
    assert rec.session_id.startswith("codex-")
    assert [s.name for s in rec.segments_in][:4] == [
        "tools",
        "exec_command",
        "input[0]:developer",
        "input[1]:user",
    ]
    assert [s.name for s in rec.segments_out][:4] == [
        "tools",
        "exec_command",
        "messages[0]:system",
        "messages[1]:user",
    ]
    assert "Current time" in rec.texts[rec.segments_in[2].hash]


def test_the_doctor_names_the_volatile_developer_message(traffic):
    dsn, _ = traffic
    d = diagnose(dsn)
    [f] = [f for f in d.findings if f.kind == "prefix_broken"]
    assert f.facts["slice"]["slice"] in ("endpoint=responses", "client=codex_exec")
    seg = f.facts["segments"]
    assert seg["cause"] == "timestamp" and seg["volatility"] == "per-request"
    assert seg["first_unstable"] == "messages[0]:system"
    assert seg["in_segment"] == "input[0]:developer"
    assert any("09:" in x for x in seg["diffs"])
    pred = f.facts["prediction"]
    assert pred["predicted_rate"] > pred["measured_rate"] + 0.3
    assert f.facts["control"]["slice"]  # the stable entry, on the same upstream


def test_the_dashboard_splits_by_the_responses_entry(traffic):
    dsn, replica = traffic
    with ServerThread(dashboard_app(dsn, replica)) as srv:

        def get(path: str, **params) -> dict:
            r = httpx.get(
                f"{srv.url}/dashboard/api/{path}", params={"since": "all", **params}, timeout=60
            )
            assert r.status_code == 200, r.text
            return r.json()

        overview = get("overview")
        by_entry = {s["value"]: s for s in overview["slices"]["endpoint"]}
        assert set(by_entry) == {"responses", "chat"}
        assert by_entry["responses"]["hit_rate"] < by_entry["chat"]["hit_rate"] - 0.3
        rows = get("requests", endpoint="responses", limit=TURNS * SESSIONS)["rows"]
        assert len(rows) == SESSIONS * TURNS
        view = get(f"requests/{rows[0]['request_id']}")
        seg = view["segments_out"][view["changed_out"]["index"]]
        assert seg["name"] == "messages[0]:system"
