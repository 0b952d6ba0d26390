"""Engine truth from a REAL SGLang 0.5.23: its KV events (maps, signed 64-bit block hashes,
pages of 32 tokens, its own replay protocol) read by ``events/``, the index against its
``cached_tokens``, the miss ledger, ``AllBlocksCleared`` on ``/flush_cache`` (the index
emptied; through the gateway, the loss booked ``cleared``, no capacity finding) and
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
from prefixgate.doctor import diagnose
from prefixgate.events import EngineEvents, content_keys
from tests.real import harness, harness_sglang
from tests.real.engine_gateway import (
    check_ledgers_on_one_replica,
    check_precise_routing,
    drive,
    gateway,
    precise_channel,
    say_ledgers,
    send,
    send_turns,
    stored,
    tokenize,
    until_held,
    until_listening,
    until_written,
)
from tests.real.test_kv_events import session_prompt, turn

PAGE = harness_sglang.SGLANG_PAGE_SIZE


def _channel(server, events: dict) -> dict:
    return harness.kv_events_channel(server, events)


def test_the_index_and_the_ledger_on_a_real_sglang(sglang_events, say, tmp_path) -> None:
    """Bind mode. Three sessions, six turns, through the gateway with a store: every ledger
    sums to its ``prompt_tokens`` at SGLang's page size, the index predicts SGLang's
    ``cached_tokens`` on at least 99% of requests while the sessions evict each other."""
    server, events = sglang_events
    with gateway(tmp_path, _channel(server, events), "sglang") as gw:
        sent = drive(gw.app, gw.url, server, (server.base_url,), turns=6)
        mismatches = gw.app.state.ledger.token_mismatches
        status = gw.app.state.events.statuses()
    records, ledgers = stored(gw.dsn, sent)
    say_ledgers(say, records, ledgers)
    say(f"events status: {status}")
    check_ledgers_on_one_replica(say, records, ledgers, mismatches)
    assert all(x.hit % PAGE == 0 for x in ledgers)  # SGLang's cache hits whole pages


def test_a_changed_system_prompt_is_booked_prefix_changed(sglang_events, say, tmp_path):
    """One session whose second turn edits its system prompt in the middle: SGLang hits
    the pages before the edit, and the ledger books the previous prompt's tokens after it
    ``prefix_changed`` at the system segment (the rest of the new tail ``cold``)."""
    server, events = sglang_events
    nonce = secrets.token_hex(4)
    system = session_prompt(nonce, 0)
    middle = system.index(" ", len(system) // 2)
    edited = system[:middle] + " (edited)" + system[middle:]
    first = [{"role": "system", "content": system}, turn(0, 0)[0]]
    second = [{"role": "system", "content": edited}, *turn(0, 0), turn(0, 1)[0]]
    with gateway(tmp_path, _channel(server, events), "changed") as gw:
        sent = send_turns(gw.app, gw.url, server, f"{nonce}-0", [first, second])
    records, ledgers = stored(gw.dsn, sent)
    say_ledgers(say, records, ledgers)
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
            await _flush_async(http, server)
            await _until(lambda: counters.clears > before)
            out["clears"] = counters.clears - before
            out["held_after_flush"] = len(index.replica(replica))
            out["after_flush"] = await cached_and_predicted(index)
            out["lost_batches"] = status.lost_batches
            out["malformed"] = status.malformed
        finally:
            await hub.aclose()
    return out


def test_a_flush_is_booked_cleared_not_capacity(sglang_events, say, tmp_path) -> None:
    """A prompt through the gateway, SGLang's ``/flush_cache``, the same prompt again: the
    repeat misses, and its ledger books the lost pages ``evicted`` with all of them
    ``cleared`` (the engine's ``AllBlocksCleared``, not an eviction for room); the doctor
    names the clear (``cache_cleared``), not the KV cache's size (``kv_capacity``)."""
    server, events = sglang_events
    messages = [
        {"role": "system", "content": session_prompt(secrets.token_hex(4), 5)},
        {"role": "user", "content": "Which file first?"},
    ]
    replicas = (server.base_url,)
    with gateway(tmp_path, _channel(server, events), "flush") as gw:
        index = until_listening(gw.app, replicas)
        counters = index.replica(server.base_url).counters
        with httpx.Client(timeout=120) as http:
            keys = content_keys(tokenize(http, server, messages), PAGE)
            sent = [send(http, gw.url, server, "flushed", messages)]
            until_held(index, replicas, keys)
            before = counters.clears
            _flush(http, server)
            asyncio.run(_until(lambda: counters.clears > before))
            sent.append(send(http, gw.url, server, "flushed", messages))
            until_held(index, replicas, keys)
        until_written(gw.app, len(sent))
    records, ledgers = stored(gw.dsn, sent)
    say_ledgers(say, records, ledgers)
    first, repeat = ledgers
    assert repeat.total() == records[repeat.request_id].prompt_tokens
    lost = (repeat.prompt_tokens - 1) // PAGE * PAGE
    assert repeat.hit == 0 and repeat.engine_cached == 0
    assert repeat.evicted == repeat.cleared == lost > 0, repeat
    assert first.cleared == 0
    kinds = {f.kind: f for f in diagnose(gw.dsn).findings}
    say(f"doctor: {sorted(kinds)}")
    assert "kv_capacity" not in kinds
    assert kinds["cache_cleared"].facts["cleared_tokens"] == lost


# SGLang flushes only an idle scheduler: a request whose whole answer the client already
# has can still sit in its running batch for a moment, and ``/flush_cache`` answers 400
# "Flush cache failed." then (seen once in CI). The tests ask again until it flushes.
FLUSH_LIMIT = 60.0


def _flush(http: httpx.Client, server) -> None:
    deadline = time.monotonic() + FLUSH_LIMIT
    while (resp := http.post(server.url + "/flush_cache")).status_code != 200:
        assert time.monotonic() < deadline, resp.text
        time.sleep(0.05)


async def _flush_async(http: httpx.AsyncClient, server) -> None:
    deadline = time.monotonic() + FLUSH_LIMIT
    while (resp := await http.post(server.url + "/flush_cache")).status_code != 200:
        assert time.monotonic() < deadline, resp.text
        await asyncio.sleep(0.05)


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
    (a, _), (b, _) = sglang_events, sglang_events_b
    channel = precise_channel((sglang_events, sglang_events_b), tiny_model)
    with gateway(tmp_path, channel, "precise") as gw:
        sent = drive(gw.app, gw.url, a, (a.base_url, b.base_url), turns=4)
        modes = {s["replica"]: s["mode"] for s in gw.app.state.events.statuses()}
    records, ledgers = stored(gw.dsn, sent)
    say_ledgers(say, records, ledgers)
    say(f"subscriber modes: {modes}")
    assert sorted(modes.values()) == ["bind", "connect"]
    check_precise_routing(say, sent, records, ledgers)
