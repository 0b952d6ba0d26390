"""The miss ledger against a REAL vLLM 0.32 (CPU build) publishing its KV events, through
the gateway: three agent sessions sharing a team prompt over a KV cache of 48 blocks of
32 tokens, so that they evict each other. Every request is recorded; its ledger is
computed by the gateway off the request path (the prompt's tokens from vLLM's
``/tokenize``, the index read as of the request's time) and read back from the store.

Between requests the test waits until the index holds every full block of the prompt
just served (the events of a step arrive after its response; a wait on the index's state,
not on time), as ``test_kv_events.py`` does."""

from __future__ import annotations

from tests.real import harness
from tests.real.engine_gateway import (
    check_ledgers_on_one_replica,
    drive,
    gateway,
    say_ledgers,
    stored,
)


def test_the_ledger_on_a_real_vllm(vllm_kv_events, say, tmp_path) -> None:
    server, events = vllm_kv_events
    channel = harness.kv_events_channel(server, events)
    with gateway(tmp_path, channel) as gw:
        sent = drive(gw.app, gw.url, server, (server.base_url,), turns=6)
        mismatches = gw.app.state.ledger.token_mismatches
    records, ledgers = stored(gw.dsn, sent)
    say_ledgers(say, records, ledgers)
    check_ledgers_on_one_replica(say, records, ledgers, mismatches)
