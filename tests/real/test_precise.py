"""``routing: precise`` against two REAL vLLM 0.32 replicas (CPU build), each publishing
its KV events: the gateway turns each request into the engine's token ids itself (the
model's chat template and tokenizer), looks its blocks up in both replicas' indexes and
sends it to the one holding the longest prefix. Three agent sessions sharing a team
prompt, four turns each, one request at a time (the load guard never fires).

Between requests the test waits until one replica's index holds every full block of the
prompt just served (the events of a step arrive after its response; a wait on the index's
state, not on time), as ``test_kv_events.py`` does."""

from __future__ import annotations

from prefixgate.config import parse_config
from prefixgate.serve.app import build_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from tests.real import harness
from tests.real.test_ledger import drive

B = harness.BLOCK_SIZE


def _events(events: dict) -> dict:
    return {k: events[k] for k in ("endpoint", "replay_endpoint")}


def test_precise_routing_over_two_real_vllms(
    vllm_kv_events, vllm_kv_events_b, tiny_model, say, tmp_path
) -> None:
    (a, ev_a), (b, ev_b) = vllm_kv_events, vllm_kv_events_b
    channel = {
        "name": "real",
        "base_url": a.base_url,
        "replicas": [b.base_url],
        "routing": "precise",
        "chat_template": str(tiny_model / "tokenizer_config.json"),
        "tokenizer": f"hf:{tiny_model}",
        "kv_events": {
            "topic": ev_a["topic"],
            "block_size": B,
            "replicas": [_events(ev_a), _events(ev_b)],
        },
    }
    dsn = f"sqlite:///{tmp_path}/precise.db"
    config = parse_config(
        {"channels": [channel], "store": {"dsn": dsn, "journal_path": str(tmp_path / "j")}}
    )
    app = build_app(config)
    with ServerThread(app) as srv:
        sent = drive(app, srv.url, a, (a.base_url, b.base_url), turns=4)
    with open_store(dsn) as store:
        records = {r.request_id: r for r in store.iter_records()}
        ledgers = [store.get_ledger(rid) for rid in sent]
    served = {}
    for rid, x in zip(sent, ledgers, strict=True):
        rec = records[rid]
        served.setdefault(rec.session_id, []).append(rec.replica)
        say(
            f"{rec.session_id[-1]} {rec.route_source} prompt {x.prompt_tokens:4d} engine "
            f"{x.engine_cached:4d} index {x.index_predicted:4d} "
            + " ".join(f"{c} {v}" for c, v in x.parts().items() if v)
        )
    say(f"replicas per session: { {k[-1]: v for k, v in served.items()} }")
    assert all(records[rid].route_source == "events" for rid in sent)
    for x in ledgers:
        assert x.source == "events" and x.total() == records[x.request_id].prompt_tokens
    # Each later turn went where its session's prefix was cached: nothing recomputed that
    # the other replica held, and it hit its history. A first request matches only the
    # team's block elsewhere (1 of 11 blocks, under routing_match_threshold): at most
    # that is booked as a routing loss.
    later = ledgers[3:]
    assert sum(x.elsewhere for x in later) == 0
    assert all(x.elsewhere <= B for x in ledgers[:3])
    assert all(x.hit > 0 for x in later), [x.hit for x in later]
    assert all(len(set(urls)) == 1 for urls in served.values())
    agree = sum(x.index_predicted == x.engine_cached for x in ledgers)
    say(f"the index predicted the engine's cached_tokens for {agree} of {len(ledgers)}")
    assert agree >= 0.99 * len(ledgers)
