"""Prometheus counters per key, owner and model, with bounded label cardinality."""

from __future__ import annotations

import hashlib
import os

import httpx
from prometheus_client.parser import text_string_to_metric_families

from prefixgate.metrics import LABEL_CAPS, GatewayMetrics
from prefixgate.record import Record
from tests.fakes import Reply


def samples(text: str, name: str) -> dict[tuple, float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_spend_counters_per_key_owner_and_model(gateway, upstream):
    keys = [
        {"name": n, "owner": "team", "key_sha256": hashlib.sha256(n.encode()).hexdigest()}
        for n in ("alice", "bob")
    ]
    prices = {"models": {"m": {"input": 1.0, "cached_input": 0.1, "output": 4.0}}}
    admin = hashlib.sha256(b"admin").hexdigest()
    gw = gateway(keys=keys, prices=prices, admin_key_sha256=admin)
    upstream.script = lambda body: Reply(
        text="ok", prompt_tokens=1000, cached_tokens=600, completion_tokens=10
    )
    for key in ("alice", "alice", "bob"):
        r = httpx.post(
            gw.url + "/v1/chat/completions",
            headers={"x-api-key": key},
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 200
    assert len(gw.records) == 3
    text = httpx.get(gw.url + "/metrics", headers={"x-api-key": "admin"}).text
    tokens = samples(text, "prefixgate_spend_tokens_total")
    alice = (("key", "alice"), ("model", "m"), ("owner", "team"))
    assert tokens[(*alice[:1], ("kind", "fresh"), *alice[1:])] == 800
    assert tokens[(*alice[:1], ("kind", "cached"), *alice[1:])] == 1200
    assert tokens[(*alice[:1], ("kind", "output"), *alice[1:])] == 20
    cost = samples(text, "prefixgate_spend_cost_total")
    # 400 fresh at 1.0 + 600 cached at 0.1 + 10 out at 4.0 per million, twice
    assert cost[alice] == 2 * (400 * 1.0 + 600 * 0.1 + 10 * 4.0) / 1e6
    saved = samples(text, "prefixgate_spend_cost_saved_total")
    assert saved[(("key", "bob"), ("model", "m"), ("owner", "team"))] == 600 * 0.9 / 1e6


def test_label_values_beyond_the_cap_share_other():
    m = GatewayMetrics()
    n = LABEL_CAPS["model"] + 25
    for i in range(n):
        rec = Record(request_id=str(i), received_at=0.0, requested_model=f"made-up-{i}")
        rec.channel, rec.endpoint, rec.status, rec.key_name = "c", "chat", 404, f"k{i}"
        rec.prompt_tokens, rec.completion_tokens = 10, 1
        m.observe(rec)
    text = m.render().decode()
    models = {dict(k)["model"] for k in samples(text, "prefixgate_requests_total")}
    assert len(models) == LABEL_CAPS["model"] + 1 and "other" in models
    other = samples(text, "prefixgate_requests_total")
    assert sum(v for k, v in other.items() if dict(k)["model"] == "other") == 25
    spend_models = {dict(k)["model"] for k in samples(text, "prefixgate_spend_tokens_total")}
    assert len(spend_models) == LABEL_CAPS["model"] + 1


def test_a_scrape_names_the_worker_process_that_answered():
    text = GatewayMetrics().render().decode()
    assert samples(text, "prefixgate_worker_info") == {(("pid", str(os.getpid())),): 1.0}
