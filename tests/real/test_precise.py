"""``routing: precise`` against two REAL vLLM 0.32 replicas (CPU build), each publishing
its KV events: the gateway turns each request into the engine's token ids itself (the
model's chat template and tokenizer), looks its blocks up in both replicas' indexes and
sends it to the one holding the longest prefix. Three agent sessions sharing a team
prompt, four turns each, one request at a time (the load guard never fires).

Between requests the test waits until one replica's index holds every full block of the
prompt just served (the events of a step arrive after its response; a wait on the index's
state, not on time), as ``test_kv_events.py`` does."""

from __future__ import annotations

from tests.real.engine_gateway import (
    check_precise_routing,
    drive,
    gateway,
    precise_channel,
    say_ledgers,
    stored,
)


def test_precise_routing_over_two_real_vllms(
    vllm_kv_events, vllm_kv_events_b, tiny_model, say, tmp_path
) -> None:
    (a, _), (b, _) = vllm_kv_events, vllm_kv_events_b
    channel = precise_channel((vllm_kv_events, vllm_kv_events_b), tiny_model)
    with gateway(tmp_path, channel, "precise") as gw:
        sent = drive(gw.app, gw.url, a, (a.base_url, b.base_url), turns=4)
    records, ledgers = stored(gw.dsn, sent)
    say_ledgers(say, records, ledgers)
    check_precise_routing(say, sent, records, ledgers)
