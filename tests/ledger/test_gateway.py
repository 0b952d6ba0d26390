"""The miss ledger through the real gateway: the simulated upstream (two replicas with
small KV caches, publishing vLLM's KV events over real sockets), the official OpenAI SDK
over loopback, a SQLite store; every request's ledger read back from the store and the
dashboard's API."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from prefixgate.config import parse_config
from prefixgate.lab.events.publisher import PublisherSettings
from prefixgate.lab.upstream_sim import SimSettings, running_upstreams
from prefixgate.ledger import CAUSES
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from tests.conftest import settled

B = 16
SYSTEM = "You are a careful coding agent. Read before you write. " * 30


def conversation(session: int, turns: int):
    """(turn, messages) of one agent session; session 3 edits its system prompt at turn 3
    (a date changes), so its next prompt differs early."""
    history = [{"role": "system", "content": SYSTEM + f"Workspace {session}. " * 8}]
    for t in range(turns):
        if session == 3 and t == 3:
            history[0] = {"role": "system", "content": "Today is Tuesday. " + history[0]["content"]}
        history.append({"role": "user", "content": f"Turn {t}: fix bug {session}-{t}. " * 5})
        yield t, list(history)
        history.append({"role": "assistant", "content": f"Fixed {session}-{t}. " * (2 + t)})


def wait_applied(app, ups, limit: float = 30.0) -> None:
    """Until the gateway applied every batch each upstream published (the index is
    judged on what its events said, not on a race with them)."""
    hub = app.state.events
    deadline = time.monotonic() + limit
    for up in ups:
        pub, st = up.app.state.sim.events, hub.status("sim", up.base_url)
        while (-1 if st.last_seq is None else st.last_seq) != pub.next_seq - 1:
            assert time.monotonic() < deadline, hub.statuses()
            time.sleep(0.005)


def wait_stored(app, n: int, limit: float = 30.0) -> None:
    """Until the store has ``n`` records and their ledgers."""
    ledger, writer = app.state.ledger, app.state.gateway.recorder
    deadline = time.monotonic() + limit
    while ledger.written < n or writer.stats().written < n:
        assert time.monotonic() < deadline, (ledger.computed, ledger.written, ledger.failed)
        time.sleep(0.01)


@pytest.fixture
def sim():
    settings = SimSettings(
        block_size=B,
        capacity_tokens=40 * B,  # two sessions do not fit in one replica: evictions
        kv_events=PublisherSettings("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "kv", "map"),
    )
    with running_upstreams(settings, replicas=2) as ups:
        yield ups


def gateway_config(ups, tmp_path, routing: str) -> dict:
    endpoints = [
        {
            "endpoint": "tcp://*:" + u.app.state.sim.events.endpoint.rsplit(":", 1)[1],
            "replay_endpoint": "tcp://*:"
            + u.app.state.sim.events.replay_endpoint.rsplit(":", 1)[1],
        }
        for u in ups
    ]
    channel = {
        "name": "sim",
        "base_url": ups[0].base_url,
        "replicas": [u.base_url for u in ups[1:]],
        "routing": {"policy": routing},
        "kv_events": {"replicas": endpoints, "topic": "kv"},
    }
    store = {"dsn": f"sqlite:///{tmp_path}/g.db", "journal_path": str(tmp_path / "journal")}
    return {"channels": [channel], "store": store}


def test_every_request_gets_a_ledger_from_the_events(sim, tmp_path) -> None:
    ups = sim
    app = create_app(parse_config(gateway_config(ups, tmp_path, "round_robin")))
    with ServerThread(app) as srv:
        hub = app.state.events
        deadline = time.monotonic() + 30
        for up in ups:
            while not up.app.state.sim.events.wait_for_subscribers(1, 0.1):
                assert time.monotonic() < deadline
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="any", max_retries=0)
        sessions = {s: conversation(s, 5) for s in range(4)}
        sent = []
        for _ in range(5):
            for s, turns in sessions.items():
                _, messages = next(turns)
                r = client.chat.completions.with_raw_response.create(
                    model="sim-model", messages=messages, max_tokens=20, user=f"session-{s}"
                )
                sent.append(r.headers["x-request-id"])
                wait_applied(app, ups)
        settled(app.state.gateway)
        wait_stored(app, len(sent))
        assert hub is not None
        api = f"{srv.url}/dashboard/api"
        details = {rid: httpx.get(f"{api}/requests/{rid}", timeout=30).json() for rid in sent}
        overview = httpx.get(f"{srv.url}/dashboard/api/overview?since=all", timeout=30).json()
        metrics = httpx.get(f"{srv.url}/metrics", timeout=30).text
    with open_store(f"sqlite:///{tmp_path}/g.db") as store:
        records = {r.request_id: r for r in store.iter_records()}
        ledgers = [store.get_ledger(rid) for rid in sent]
    assert all(x is not None for x in ledgers)
    for x in ledgers:
        rec = records[x.request_id]
        assert x.source == "events" and x.prompt_tokens == rec.prompt_tokens
        assert x.total() == rec.prompt_tokens, x  # the parts sum to the prompt exactly
        # the simulated vLLM leaves cached_tokens out when nothing hit
        assert x.hit == (rec.cached_tokens or 0) and x.engine_cached == rec.cached_tokens
    wrong = [x for x in ledgers if x.index_predicted != (x.engine_cached or 0)]
    assert not wrong, wrong
    totals = {c: sum(getattr(x, c) for x in ledgers) for c in CAUSES}
    # round robin sends each session's next turn to the other replica, the small caches
    # evict, session 3's changed system prompt breaks its prefix
    assert totals["hit"] > 0 and totals["elsewhere"] > 0 and totals["evicted"] > 0
    assert totals["partial_block"] > 0 and totals["cold"] > 0 and totals["unknown"] == 0
    changed = [x for x in ledgers if x.prefix_changed]
    assert changed and {x.changed_segment for x in changed} == {"messages[0]:system"}
    assert all(records[x.request_id].session_id == "session-3" for x in changed)
    for x in ledgers:  # the request's ledger in the dashboard's API
        shown = details[x.request_id]["ledger"]
        assert shown["parts"] == x.parts() and shown["source"] == "events"
        assert shown["agree"]["index"] is (None if x.engine_cached is None else True)
    assert overview["ledger"]["totals"] == totals
    assert sum(sum(v) for v in overview["ledger"]["causes"].values()) == sum(totals.values())
    assert 'prefixgate_hit_prediction_agreement{channel="sim",predictor="index"} 1.0' in metrics
    assert (
        f'prefixgate_ledger_tokens_total{{cause="evicted",channel="sim"}} {totals["evicted"]}.0'
        in metrics
    )
