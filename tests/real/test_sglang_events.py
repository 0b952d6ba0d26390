"""Engine truth from a REAL SGLang 0.5.23: its KV events (maps, signed 64-bit block hashes,
pages of 32 tokens, its own replay protocol) read by ``events/``, the index against its
``cached_tokens``, the miss ledger, ``AllBlocksCleared`` on ``/flush_cache`` and
``routing: precise`` over two SGLang replicas.

Two servers with a KV cache of 48 pages of 32 tokens (``SGLANG_KV_TOKENS``), so that
three agent sessions sharing a team prompt evict each other: ``sglang_events`` binds its
PUB socket (the gateway connects: ``bind`` mode), ``sglang_events_b`` connects to an
address the gateway binds (``connect`` mode). Both bind their replay ROUTER.

Between requests the tests wait until the index holds every full page of the prompt
just served (the events of a step arrive after its response; a wait on the index's
state, not on time), as ``test_kv_events.py`` does against vLLM.
"""

from __future__ import annotations

import asyncio
import secrets
import time

import httpx

from prefixgate.config import parse_config
from prefixgate.events import EngineEvents, content_keys
from prefixgate.ledger import CAUSES
from prefixgate.serve.app import build_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from tests.real import harness, harness_sglang
from tests.real.test_kv_events import session_prompt, turn
from tests.real.test_ledger import drive, until_held, until_listening, until_written

PAGE = harness_sglang.SGLANG_PAGE_SIZE


def _channel(server, events: dict) -> dict:
    return harness.kv_events_channel(server, events)


def _ledgers(dsn: str, sent: list[str]) -> tuple[dict, list]:
    with open_store(dsn) as store:
        records = {r.request_id: r for r in store.iter_records()}
        ledgers = [store.get_ledger(rid) for rid in sent]
    assert all(x is not None for x in ledgers)
    return records, ledgers


def _say_ledgers(say, records: dict, ledgers: list) -> None:
    for x in ledgers:
        rec = records[x.request_id]
        say(
            f"{rec.session_id[-1]} {rec.replica[-5:-3]} prompt {x.prompt_tokens:5d} engine "
            f"{x.engine_cached:5d} index {x.index_predicted:5d} "
            + " ".join(f"{c} {v}" for c, v in x.parts().items() if v)
        )


def test_the_index_and_the_ledger_on_a_real_sglang(sglang_events, say, tmp_path) -> None:
    """Bind mode. Three sessions, six turns, through the gateway with a store: every ledger
    sums to its ``prompt_tokens`` at SGLang's page size, the index predicts SGLang's
    ``cached_tokens`` on at least 99% of requests while the sessions evict each other."""
    server, events = sglang_events
    channel = _channel(server, events)
    dsn = f"sqlite:///{tmp_path}/sglang.db"
    config = parse_config(
        {"channels": [channel], "store": {"dsn": dsn, "journal_path": str(tmp_path / "j")}}
    )
    app = build_app(config)
    with ServerThread(app) as srv:
        sent = drive(app, srv.url, server, (server.base_url,), turns=6)
        mismatches = app.state.ledger.token_mismatches
        status = app.state.events.statuses()
    records, ledgers = _ledgers(dsn, sent)
    _say_ledgers(say, records, ledgers)
    say(f"events status: {status}")
    assert mismatches == 0  # SGLang's /tokenize is exact
    for x in ledgers:
        assert x.source == "events" and x.total() == records[x.request_id].prompt_tokens
        assert x.hit == x.engine_cached and x.hit % PAGE == 0
    agree = sum(x.index_predicted == x.engine_cached for x in ledgers)
    say(f"the index predicted SGLang's cached_tokens for {agree} of {len(ledgers)} requests")
    assert agree >= 0.99 * len(ledgers)
    totals = {c: sum(getattr(x, c) for x in ledgers) for c in CAUSES}
    say(f"tokens by cause: {totals}")
    assert totals["evicted"] > 0 and totals["hit"] > 0 and totals["cold"] > 0
    assert totals["unknown"] == 0 and totals["elsewhere"] == 0  # one replica


def test_a_changed_system_prompt_is_booked_prefix_changed(sglang_events, say, tmp_path):
    """One session whose second turn edits its system prompt in the middle: SGLang hits
    the pages before the edit, and the ledger books the previous prompt's tokens after it
    ``prefix_changed`` at the system segment (the rest of the new tail ``cold``)."""
    server, events = sglang_events
    dsn = f"sqlite:///{tmp_path}/changed.db"
    config = parse_config(
        {
            "channels": [_channel(server, events)],
            "store": {"dsn": dsn, "journal_path": str(tmp_path / "j")},
        }
    )
    nonce = secrets.token_hex(4)
    system = session_prompt(nonce, 0)
    middle = system.index(" ", len(system) // 2)
    edited = system[:middle] + " (edited)" + system[middle:]
    first = [{"role": "system", "content": system}, turn(0, 0)[0]]
    second = [{"role": "system", "content": edited}, *turn(0, 0), turn(0, 1)[0]]
    app = build_app(config)
    with ServerThread(app) as srv:
        sent = send_turns(app, srv.url, server, f"{nonce}-0", [first, second])
    records, ledgers = _ledgers(dsn, sent)
    _say_ledgers(say, records, ledgers)
    x = ledgers[1]
    assert x.total() == records[x.request_id].prompt_tokens
    assert 0 < x.hit < ledgers[0].prompt_tokens // 2 + PAGE
    assert x.prefix_changed > 0 and x.changed_segment == "messages[0]:system", x
    assert x.index_predicted == x.engine_cached


def test_replay_joins_a_running_sglang_and_flush_cache_clears_the_index(sglang_events, say):
    """A subscriber that starts after SGLang has served a prompt learns that SGLang holds
    it from SGLang's replay socket (a DEALER sends the start sequence; batches come back,
    ended by sequence ``0xFF…FF``), and predicts the repeat's ``cached_tokens`` exactly;
    ``/flush_cache`` publishes ``AllBlocksCleared``, which empties the replica's index, and
    the repeat is then cold, as predicted. (SGLang also clears once while it starts: its
    warm-up batch, sequence 0, holds an ``AllBlocksCleared``.)"""
    server, events = sglang_events
    rows = asyncio.run(_replay_and_flush(server, events))
    say(f"replay and flush: {rows}")
    assert rows["replayed_batches"] > 0 and rows["held_after_replay"] == rows["pages"]
    assert rows["lost_batches"] == 0 and rows["malformed"] == 0
    assert rows["repeat"] == (rows["predicted"], rows["predicted"])
    assert rows["predicted"] == (rows["prompt_tokens"] - 1) // PAGE * PAGE
    assert rows["clears"] == 1 and rows["held_after_flush"] == 0
    assert rows["after_flush"] == (0, 0)


async def _replay_and_flush(server, events: dict) -> dict:
    replica = server.base_url
    messages = [
        {"role": "system", "content": session_prompt(secrets.token_hex(4), 7)},
        {"role": "user", "content": "Which file first?"},
    ]
    out: dict = {}
    async with httpx.AsyncClient(timeout=120) as http:
        tokens = (
            await http.post(
                server.url + "/tokenize", json={"model": server.served_model, "messages": messages}
            )
        ).json()["tokens"]
        keys = content_keys(tokens, PAGE)
        out["prompt_tokens"], out["pages"] = len(tokens), len(keys)
        chat = {"model": server.served_model, "messages": messages, "max_tokens": 1}

        async def cached_and_predicted(index) -> tuple[int, int]:
            held = index.longest_prefix(replica, keys, touch=False).gpu
            predicted = min(held, (len(tokens) - 1) // PAGE) * PAGE
            resp = await http.post(server.base_url + "/chat/completions", json=chat)
            assert resp.status_code == 200, resp.text
            return resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"], predicted

        first = await http.post(server.base_url + "/chat/completions", json=chat)
        assert first.status_code == 200, first.text
        hub = EngineEvents.from_config(parse_config({"channels": [_channel(server, events)]}))
        await hub.start()
        try:
            await hub.wait_publishers(timeout=120)
            index = hub.channels["real"].index
            status = hub.status("real", replica)
            out["replayed_batches"] = status.replayed_batches
            out["held_after_replay"] = index.longest_prefix(replica, keys, touch=False).gpu
            out["repeat"] = await cached_and_predicted(index)
            out["predicted"] = out["repeat"][1]
            counters = index.replica(replica).counters
            before = counters.clears
            flushed = await http.post(server.url + "/flush_cache")
            assert flushed.status_code == 200, flushed.text
            await _until(lambda: counters.clears > before)
            out["clears"] = counters.clears - before
            out["held_after_flush"] = len(index.replica(replica))
            out["after_flush"] = await cached_and_predicted(index)
            out["lost_batches"] = status.lost_batches
            out["malformed"] = status.malformed
        finally:
            await hub.aclose()
    return out


async def _until(condition, limit: float = 60.0) -> None:
    """Until ``condition()`` (the engine's events arrive after its answer)."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "the engine's events never came"
        await asyncio.sleep(0.005)


def test_precise_routing_over_two_real_sglangs(
    sglang_events, sglang_events_b, tiny_model, say, tmp_path
) -> None:
    """Two SGLang replicas, one publishing in bind mode, one in connect mode, behind one
    channel with ``routing: precise`` and the model's template and tokenizer: every
    decision comes from the events, each session stays on one replica and hits its
    history, every ledger sums to its prompt and the index predicts SGLang's figure."""
    (a, ev_a), (b, ev_b) = sglang_events, sglang_events_b
    channel = {
        "name": "real",
        "base_url": a.base_url,
        "replicas": [b.base_url],
        "routing": "precise",
        "chat_template": str(tiny_model / "tokenizer_config.json"),
        "tokenizer": f"hf:{tiny_model}",
        "kv_events": {
            "topic": ev_a["topic"],
            "block_size": PAGE,
            "replicas": [
                {k: ev[k] for k in ("endpoint", "replay_endpoint")} for ev in (ev_a, ev_b)
            ],
        },
    }
    dsn = f"sqlite:///{tmp_path}/precise.db"
    config = parse_config(
        {"channels": [channel], "store": {"dsn": dsn, "journal_path": str(tmp_path / "j")}}
    )
    app = build_app(config)
    with ServerThread(app) as srv:
        sent = drive(app, srv.url, a, (a.base_url, b.base_url), turns=4)
        modes = {s["replica"]: s["mode"] for s in app.state.events.statuses()}
    records, ledgers = _ledgers(dsn, sent)
    _say_ledgers(say, records, ledgers)
    say(f"subscriber modes: {modes}")
    assert sorted(modes.values()) == ["bind", "connect"]
    served: dict[str, set] = {}
    for rid in sent:
        served.setdefault(records[rid].session_id, set()).add(records[rid].replica)
    say(f"replicas per session: {served}")
    assert all(records[rid].route_source == "events" for rid in sent)
    for x in ledgers:
        assert x.source == "events" and x.total() == records[x.request_id].prompt_tokens
    later = ledgers[3:]
    assert sum(x.elsewhere for x in later) == 0
    assert all(x.elsewhere <= PAGE for x in ledgers[:3])
    assert all(x.hit > 0 for x in later), [x.hit for x in later]
    assert all(len(urls) == 1 for urls in served.values())
    agree = sum(x.index_predicted == x.engine_cached for x in ledgers)
    say(f"the index predicted SGLang's cached_tokens for {agree} of {len(ledgers)}")
    assert agree >= 0.99 * len(ledgers)


def send_turns(app, url: str, server, session: str, prompts: list[list[dict]]) -> list[str]:
    """Each prompt through the gateway at ``url`` as one session, one at a time, each
    followed by a wait until the index holds its whole pages; then until every record and
    ledger is written. The request ids."""
    index = until_listening(app, (server.base_url,))
    sent = []
    with httpx.Client(timeout=120) as http:
        for messages in prompts:
            r = http.post(
                url + "/v1/chat/completions",
                json={"model": server.served_model, "messages": messages, "max_tokens": 1},
                headers={"x-session-id": session},
            )
            assert r.status_code == 200, r.text
            sent.append(r.headers["x-request-id"])
            keys = content_keys(tokenize(http, server, messages), PAGE)
            until_held(index, (server.base_url,), keys)
    until_written(app, len(sent))
    return sent


def tokenize(http: httpx.Client, server, messages: list[dict]) -> list[int]:
    r = http.post(
        server.url + "/tokenize", json={"model": server.served_model, "messages": messages}
    )
    assert r.status_code == 200, r.text
    return r.json()["tokens"]
