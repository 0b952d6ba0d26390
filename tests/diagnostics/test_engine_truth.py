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
import pytest

from prefixgate.config import parse_config
from prefixgate.diagnostics.verdict import EXTENSION
from prefixgate.events.publisher import PublisherSettings
from prefixgate.serve.app import build_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from prefixgate.upstream_sim import SimSettings, running_upstreams
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
    app = build_app(parse_config(gateway_config(ups, tmp_path, "round_robin")))
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
        for k in range(3):  # other conversations take the whole cache: the first is evicted
            client.messages.create(
                model="sim-model",
                max_tokens=16,
                system=f"Another agent {k}. " * 80,
                messages=[{"role": "user", "content": f"Other task {k}. " * 20}],
            )
            wait_applied(app, ups)
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
