"""The miss ledger against a REAL vLLM 0.32 (CPU build) publishing its KV events, through
the gateway: three agent sessions sharing a team prompt over a KV cache of 48 blocks of
32 tokens, so that they evict each other. Every request is recorded; its ledger is
computed by the gateway off the request path (the prompt's tokens from vLLM's
``/tokenize``, the index read as of the request's time) and read back from the store.

Between requests the test waits until the index holds every full block of the prompt
just served (the events of a step arrive after its response; a wait on the index's state,
not on time), as ``test_kv_events.py`` does."""

from __future__ import annotations

import secrets
import time

import httpx

from prefixgate.config import parse_config
from prefixgate.events import content_keys
from prefixgate.ledger import CAUSES
from prefixgate.serve.app import build_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from tests.conftest import settled
from tests.real import harness
from tests.real.test_kv_events import session_prompt, turn

B = harness.BLOCK_SIZE


def test_the_ledger_on_a_real_vllm(vllm_kv_events, say, tmp_path) -> None:
    server, events = vllm_kv_events
    channel = harness.kv_events_channel(server, events)
    dsn = f"sqlite:///{tmp_path}/real.db"
    config = parse_config(
        {"channels": [channel], "store": {"dsn": dsn, "journal_path": str(tmp_path / "j")}}
    )
    app = build_app(config)
    with ServerThread(app) as srv:
        sent = drive(app, srv.url, server, (server.base_url,), turns=6)
        mismatches = app.state.ledger.token_mismatches
    with open_store(dsn) as store:
        records = {r.request_id: r for r in store.iter_records()}
        ledgers = [store.get_ledger(rid) for rid in sent]
    assert all(x is not None for x in ledgers)
    for x in ledgers:
        rec = records[x.request_id]
        say(
            f"{rec.session_id[-1]} prompt {x.prompt_tokens:5d} engine {x.engine_cached:5d} "
            f"index {x.index_predicted:5d} model {x.model_predicted:5d} "
            + " ".join(f"{c} {v}" for c, v in x.parts().items() if v)
        )
    assert mismatches == 0  # /tokenize is exact
    for x in ledgers:
        assert x.source == "events" and x.total() == records[x.request_id].prompt_tokens
        assert x.hit == x.engine_cached
    agree = sum(x.index_predicted == x.engine_cached for x in ledgers)
    say(f"the index predicted the engine's cached_tokens for {agree} of {len(ledgers)} requests")
    assert agree >= 0.99 * len(ledgers)
    totals = {c: sum(getattr(x, c) for x in ledgers) for c in CAUSES}
    say(f"tokens by cause: {totals}")
    assert totals["evicted"] > 0 and totals["hit"] > 0 and totals["cold"] > 0
    assert totals["unknown"] == 0 and totals["elsewhere"] == 0  # one replica


def drive(app, url: str, server: harness.VllmServer, replicas: tuple, *, turns: int) -> list:
    """Three sessions sharing a team prompt, ``turns`` turns each, one request at a time
    through the gateway at ``url``; after each, a wait until a replica's index holds every
    full block of the prompt (vLLM's ``/tokenize``); then until every record and ledger
    is written. The request ids, in order (turn by turn)."""
    nonce = secrets.token_hex(4)
    histories = {s: [{"role": "system", "content": session_prompt(nonce, s)}] for s in range(3)}
    sent: list[str] = []
    index = until_listening(app, replicas)
    with httpx.Client(timeout=120) as http:
        for n in range(turns):
            for s in range(3):
                messages = [*histories[s], turn(s, n)[0]]
                r = http.post(
                    url + "/v1/chat/completions",
                    json={"model": server.served_model, "messages": messages, "max_tokens": 1},
                    headers={"x-session-id": f"{nonce}-{s}"},
                )
                assert r.status_code == 200, r.text
                sent.append(r.headers["x-request-id"])
                tok = http.post(
                    server.url + "/tokenize",
                    json={"model": server.served_model, "messages": messages},
                )
                until_held(index, replicas, content_keys(tok.json()["tokens"], B))
                histories[s] += turn(s, n)
    until_written(app, len(sent))
    return sent


def until_listening(app, replicas: tuple):
    """Until every replica's subscriber is listening: the replay read, and each engine's
    publisher connected (its handshake); what an engine publishes before that is lost
    (ZeroMQ's late join). The channel's index."""
    hub = app.state.events
    deadline = time.monotonic() + 120
    while not all(hub.subscriber("real", r).listening for r in replicas):
        assert time.monotonic() < deadline, hub.statuses()
        time.sleep(0.01)
    return hub.channels["real"].index


def until_written(app, n: int) -> None:
    """Until the gateway has recorded ``n`` requests and written their ledgers."""
    settled(app.state.gateway)
    ledger, writer = app.state.ledger, app.state.gateway.recorder
    deadline = time.monotonic() + 120
    while ledger.written < n or writer.stats().written < n:
        assert time.monotonic() < deadline, (ledger.computed, ledger.failed, writer.stats())
        time.sleep(0.05)


def until_held(index, replicas: tuple, keys: list[bytes], limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while all(index.longest_prefix(r, keys, touch=False).gpu < len(keys) for r in replicas):
        assert time.monotonic() < deadline, "the engines' events never showed the prompt"
        time.sleep(0.005)
