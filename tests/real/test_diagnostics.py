"""Diagnostics against a REAL vLLM 0.32 (CPU build) publishing its KV events, through the
gateway and the official Anthropic SDK: a conversation's second turn only appends, but
other conversations took the small KV cache (48 blocks of 32 tokens) in between. The
standard object says no divergence (nothing in the request changed), the extension's
engine figures at the end of the stream show what vLLM recomputed, and the ledger read by
the answer's id books it as evicted: the same ledger as the store's, and the same as the
one the stream's ``message_delta`` carried (computed when vLLM's usage arrived).

Between requests the test waits until the index holds every full block of the prompt the
engine was just sent (its token ids from vLLM's ``/tokenize`` of the converted request),
as ``test_ledger.py`` does."""

from __future__ import annotations

import secrets

import anthropic
import httpx

from prefixgate.apis.messages.request import ConvertOptions, anthropic_to_openai
from prefixgate.diagnostics.verdict import EXTENSION
from prefixgate.events import content_keys
from prefixgate.store import open_store
from tests.real import harness
from tests.real.engine_gateway import gateway, tokenize, until_held, until_listening, until_written
from tests.real.test_kv_events import session_prompt

B = harness.BLOCK_SIZE


def test_an_evicted_prefix_on_a_real_vllm(vllm_kv_events, say, tmp_path) -> None:
    server, events = vllm_kv_events
    channel = harness.kv_events_channel(server, events)
    nonce = secrets.token_hex(4)
    with gateway(tmp_path, channel) as gw, httpx.Client(timeout=120) as http:
        index = until_listening(gw.app, (server.base_url,))
        client = anthropic.Anthropic(base_url=gw.url, api_key="any", max_retries=0)

        def ask(system: str, messages: list[dict], previous=..., stream=False):
            body = {"model": server.served_model, "max_tokens": 1, "system": system}
            body["messages"] = messages
            if previous is not ...:
                body["diagnostics"] = {"previous_message_id": previous}
            if stream:
                with client.messages.stream(**body) as s:
                    got = list(s), s.get_final_message()
            else:
                got = [], client.messages.create(**body)
            sent = anthropic_to_openai(
                {k: v for k, v in body.items() if k != "diagnostics"},
                ConvertOptions(upstream_model=server.served_model),
            )
            keys = content_keys(tokenize(http, server, sent["messages"]), B)
            until_held(index, (server.base_url,), keys)
            return got

        system = session_prompt(nonce, 0)
        turn1 = [{"role": "user", "content": "Step 0: read part_0.py and name the function."}]
        _, first = ask(system, turn1, None)
        for k in range(1, 5):  # other sessions (nothing shared) take the 48 blocks
            other = f"Session {k} of run {nonce} works alone on module {k}, file {k}. " * 40
            ask(other, [{"role": "user", "content": f"Step {k}: go on."}])
        turn2 = [
            *turn1,
            {"role": "assistant", "content": first.content[0].text or "ok"},
            {"role": "user", "content": "Step 1: read part_1.py."},
        ]
        events, second = ask(system, turn2, first.id, stream=True)
        until_written(gw.app, 6)
        looked_up = http.get(f"{gw.url}/v1/diagnostics/{second.id}").json()
    assert second.diagnostics is None  # nothing in the request changed
    delta = next(e for e in events if e.type == "message_delta")
    engine = getattr(delta, EXTENSION)["engine"]
    ledger = looked_up["ledger"]
    say(f"engine {engine}; ledger parts {ledger['parts']}")
    assert ledger["source"] == "events"
    assert ledger["parts"]["evicted"] > 0 and ledger["parts"]["prefix_changed"] == 0
    assert engine["cached_tokens"] == ledger["parts"]["hit"]
    assert engine["missed_tokens"] == engine["prompt_tokens"] - ledger["parts"]["hit"]
    with open_store(gw.dsn) as store:
        assert store.get_ledger(second.id.removeprefix("msg_")).parts() == ledger["parts"]
        stored = store.get_ledger(second.id.removeprefix("msg_")).as_dict()
    # the same ledger came at the stream's end, computed when vLLM's usage arrived
    at_end = getattr(delta, EXTENSION)["ledger"]
    say(f"ledger at the stream's end: {at_end['parts']}")
    assert at_end == stored and at_end["parts"] == ledger["parts"]
