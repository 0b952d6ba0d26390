"""The engine's truth beside the standard object: the simulated vLLM (small KV cache,
publishing vLLM's KV events over real sockets) behind the gateway, the official Anthropic
SDK. A turn that only appends, whose prefix the engine evicted meanwhile, is no divergence
in the standard object (nothing in the request changed); the extension's engine figures
show the tokens the engine recomputed, and the miss ledger read back by the answer's id
books them as evicted, the same ledger the store holds."""

from __future__ import annotations

import time

import anthropic
import httpx
import openai
import pytest

from prefixgate.config import parse_config
from prefixgate.diagnostics.verdict import EXTENSION
from prefixgate.lab.events.publisher import PublisherSettings
from prefixgate.lab.upstream_sim import SimSettings, running_upstreams
from prefixgate.pipeline import exchange
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from tests.conftest import settled
from tests.ledger.test_gateway import gateway_config, wait_applied, wait_stored

B = 16
SYSTEM = "You are a careful coding agent. Read before you write. " * 30


@pytest.fixture
def one_replica():
    settings = SimSettings(
        block_size=B,
        capacity_tokens=40 * B,  # one conversation at a time fits
        kv_events=PublisherSettings("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "kv", "map"),
    )
    with running_upstreams(settings, replicas=1) as ups:
        yield ups


def test_an_evicted_prefix_is_no_divergence_and_the_ledger_says_evicted(one_replica, tmp_path):
    ups = one_replica
    app = create_app(parse_config(gateway_config(ups, tmp_path, "round_robin")))
    with ServerThread(app) as srv:
        deadline = time.monotonic() + 30
        while not ups[0].app.state.sim.events.wait_for_subscribers(1, 0.1):
            assert time.monotonic() < deadline
        client = anthropic.Anthropic(base_url=srv.url, api_key="any", max_retries=0)
        turn1 = [{"role": "user", "content": "Fix the failing test in parser.py. " * 5}]
        first = client.messages.create(
            model="sim-model",
            max_tokens=16,
            system=SYSTEM,
            messages=turn1,
            diagnostics={"previous_message_id": None},
        )
        wait_applied(app, ups)
        _evict(client, app, ups)  # other conversations take the whole cache
        turn2 = [
            *turn1,
            {"role": "assistant", "content": first.content[0].text},
            {"role": "user", "content": "Now run the tests."},
        ]
        with client.messages.stream(
            model="sim-model",
            max_tokens=16,
            system=SYSTEM,
            messages=turn2,
            diagnostics={"previous_message_id": first.id},
        ) as s:
            events = list(s)
            second = s.get_final_message()
        settled(app.state.gateway)
        wait_stored(app, 5)
        looked_up = httpx.get(f"{srv.url}/v1/diagnostics/{second.id}", timeout=30).json()
    # the standard object: nothing in the request changed
    assert second.diagnostics is None
    # the extension: structure at the start, the engine at the end
    assert getattr(events[0].message, EXTENSION)["answer"] == "none"
    delta = next(e for e in events if e.type == "message_delta")
    engine = getattr(delta, EXTENSION)["engine"]
    assert engine["missed_tokens"] > 0 and engine["prompt_tokens"] == second.usage.input_tokens + (
        second.usage.cache_read_input_tokens or 0
    )
    # the ledger, by the answer's id: the tokens the engine recomputed were evicted
    ledger = looked_up["ledger"]
    assert ledger["source"] == "events"
    assert ledger["parts"]["evicted"] > 0
    assert ledger["parts"]["prefix_changed"] == 0
    assert looked_up["diagnosis"]["answer"] == "none"
    with open_store(f"sqlite:///{tmp_path}/g.db") as store:
        stored = store.get_ledger(second.id.removeprefix("msg_"))
    assert ledger["parts"] == stored.parts()
    assert engine["missed_tokens"] == stored.prompt_tokens - stored.hit


def _evict(client, app, ups, n: int = 3) -> None:
    """Other conversations take the whole cache (one fits)."""
    for k in range(n):
        client.messages.create(
            model="sim-model",
            max_tokens=16,
            system=f"Another agent {k}. " * 80,
            messages=[{"role": "user", "content": f"Other task {k}. " * 20}],
        )
        wait_applied(app, ups)


def test_the_ledger_comes_at_the_answers_end_equal_to_the_stored_one(one_replica, tmp_path):
    # The miss ledger is computed when the engine's usage arrives, before the answer's
    # last event: on message_delta (a stream), on the Message, on response.completed and
    # on a chat stream's extra chunk; each the same ledger the store keeps.
    ups = one_replica
    app = create_app(parse_config(gateway_config(ups, tmp_path, "round_robin")))
    tails: dict[str, dict] = {}
    with ServerThread(app) as srv:
        deadline = time.monotonic() + 30
        while not ups[0].app.state.sim.events.wait_for_subscribers(1, 0.1):
            assert time.monotonic() < deadline
        client = anthropic.Anthropic(base_url=srv.url, api_key="any", max_retries=0)
        oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="any", max_retries=0)
        turns = [{"role": "user", "content": "Fix the failing test in parser.py. " * 5}]
        body = {"model": "sim-model", "max_tokens": 16, "system": SYSTEM}
        previous = client.messages.create(
            **body, messages=turns, diagnostics={"previous_message_id": None}
        )
        wait_applied(app, ups)
        for streamed in (True, False):
            _evict(client, app, ups)
            turns = [
                *turns,
                {"role": "assistant", "content": previous.content[0].text},
                {"role": "user", "content": f"Now run the tests ({streamed})."},
            ]
            ask = {"previous_message_id": previous.id}
            if streamed:
                with client.messages.stream(**body, messages=turns, diagnostics=ask) as s:
                    delta = next(e for e in s if e.type == "message_delta")
                    previous = s.get_final_message()
                tails[previous.id.removeprefix("msg_")] = getattr(delta, EXTENSION)
            else:
                previous = client.messages.create(**body, messages=turns, diagnostics=ask)
                tails[previous.id.removeprefix("msg_")] = getattr(previous, EXTENSION)
            wait_applied(app, ups)
        # the Responses API: response.completed carries it
        items = [{"role": "user", "content": "Write the changelog entry for it. " * 5}]
        opts = {"comparison_response_id": None}
        first = oai.responses.create(
            model="sim-model", instructions=SYSTEM, input=items, prompt_cache_options=opts
        )
        wait_applied(app, ups)
        _evict(client, app, ups)
        items = [
            *items,
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "Shorter."},
        ]
        stream = oai.responses.create(
            model="sim-model",
            instructions=SYSTEM,
            input=items,
            prompt_cache_options={"comparison_response_id": first.id},
            stream=True,
        )
        done = [e for e in stream if e.type == "response.completed"][0].response
        tails[done.id.removeprefix("resp_")] = getattr(done, EXTENSION)
        # Chat Completions on request: the extra chunk before [DONE]
        _evict(client, app, ups)
        chunks = list(
            oai.chat.completions.create(
                model="sim-model",
                messages=[{"role": "system", "content": SYSTEM}, *items],
                max_tokens=16,
                stream=True,
                extra_headers={"x-prefixgate-diagnostics": "first"},
            )
        )
        last = chunks[-1]
        tails[last.id.removeprefix("chatcmpl-")] = getattr(last, EXTENSION)
        settled(app.state.gateway)
        wait_stored(app, 16)
    assert len(tails) == 4
    with open_store(f"sqlite:///{tmp_path}/g.db") as store:
        for request_id, tail in tails.items():
            stored = store.get_ledger(request_id)
            assert stored is not None, request_id
            assert tail["ledger"] == stored.as_dict(), request_id
            assert tail["ledger"]["source"] == "events"
            assert tail["engine"]["missed_tokens"] == stored.prompt_tokens - stored.hit
    # the turns that only appended after the others took the cache: evicted, said at the end
    evicted = [t for t in tails.values() if t["compared_with"]]
    assert len(evicted) == 3 and all(t["answer"] == "none" for t in evicted)
    assert all(t["ledger"]["parts"]["evicted"] > 0 for t in evicted)


def test_a_ledger_not_ready_in_time_is_left_out_and_still_kept(one_replica, tmp_path, monkeypatch):
    # The answer's end waits for the ledger only so long; past it the answer goes without,
    # and the ledger is computed all the same, stored and served by the answer's id.
    monkeypatch.setattr(exchange, "SETTLE_WAIT", 0.0)
    ups = one_replica
    app = create_app(parse_config(gateway_config(ups, tmp_path, "round_robin")))
    with ServerThread(app) as srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key="any", max_retries=0)
        msg = client.messages.create(
            model="sim-model",
            max_tokens=16,
            system=SYSTEM,
            messages=[{"role": "user", "content": "Explain the parser."}],
            diagnostics={"previous_message_id": None},
        )
        settled(app.state.gateway)
        wait_stored(app, 1)
        looked_up = httpx.get(f"{srv.url}/v1/diagnostics/{msg.id}", timeout=30).json()
    tail = getattr(msg, EXTENSION)
    assert "engine" in tail and "ledger" not in tail
    assert looked_up["ledger"]["prompt_tokens"] == tail["engine"]["prompt_tokens"]
