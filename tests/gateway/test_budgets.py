"""Budgets through the real gateway, with the official SDKs on loopback: refused in each
protocol's own shape once spent, what is left in the headers, settled to the records'
own charges, shared by two gateways through the real Redis, and kept across a restart
through the store."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time

import anthropic
import httpx
import openai
import pytest

from prefixgate.config import parse_config
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.spend.counters import RedisCounters
from prefixgate.store import open_store
from tests.conftest import settled
from tests.fakes import Reply

REDIS_URL = "redis://127.0.0.1:6379/0"
PRICES = {"models": {"m": {"input": 0.60, "cached_input": 0.06, "output": 2.40}}}
# The scripted upstream's usage: 100 prompt tokens (none cached) and 7 out, so each
# request costs 100 * 0.60 + 7 * 2.40 micro-dollars = 76,800 nanos, and 107 tokens.
COST, TOKENS = 76_800, 107


def _key(budgets, owner=None, name=None):
    secret = "pg-" + secrets.token_hex(8)
    name = name or "k" + secrets.token_hex(4)  # counters are named by key: unique per test
    cfg = {
        "name": name,
        "owner": owner,
        "key_sha256": hashlib.sha256(secret.encode()).hexdigest(),
        "budgets": budgets,
    }
    return secret, cfg


def _spent(gw, counters_prefix: str) -> list[tuple[int, int]]:
    """(spent, reserved) of the gateway's counters whose names start with the prefix."""
    counters = gw.gateway.budgets.counters
    names = [n for n in counters._counters if n.startswith(counters_prefix)]
    return [(counters._counters[n].spent, counters._counters[n].reserved) for n in names]


def _chat(gw, secret: str, **body) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    return httpx.post(
        gw.url + "/v1/chat/completions", headers={"authorization": f"Bearer {secret}"}, json=body
    )


def _wait_settled(gw) -> None:
    settled(gw.gateway)
    deadline = time.monotonic() + 10
    while gw.gateway.budgets._tasks:
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_a_token_budget_refuses_in_each_protocol(gateway, upstream):
    """Chat Completions, Messages and Responses, each in its own envelope."""
    secret, key = _key(["300 tokens/day"])
    gw = gateway(keys=[key])
    a = anthropic.Anthropic(base_url=gw.url, api_key=secret, max_retries=0)
    o = openai.OpenAI(base_url=gw.url + "/v1", api_key=secret, max_retries=0)
    left = []
    for _ in range(3):  # 107, 214, 321 tokens: the third crosses the budget
        raw = o.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=16
        )
        left.append(int(raw.headers["x-budget-remaining-tokens"]))
        _wait_settled(gw)
    # what is left after each request's hold (its prompt at ~4 bytes a token + max_tokens)
    assert left[0] > left[1] > left[2] and left[0] < 300
    with pytest.raises(openai.RateLimitError) as info:
        o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    err = info.value
    assert err.status_code == 429 and err.code == "insufficient_quota"
    assert err.body["type"] == "insufficient_quota"
    assert "budget exceeded" in err.message and "321 tokens" in err.message
    assert err.response.headers["x-should-retry"] == "false"
    assert int(err.response.headers["retry-after"]) >= 1
    with pytest.raises(anthropic.RateLimitError) as ainfo:
        a.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert ainfo.value.body["error"]["type"] == "rate_limit_error"
    assert "of its budget of 300 tokens/day" in ainfo.value.body["error"]["message"]
    with pytest.raises(openai.RateLimitError) as rinfo:
        o.responses.create(model="m", input="x", max_output_tokens=8)
    assert rinfo.value.code == "insufficient_quota" and "budget exceeded" in rinfo.value.message
    recs = gw.records
    assert [r.status for r in recs] == [200, 200, 200, 429, 429, 429]
    assert recs[-1].endpoint == "responses"
    assert recs[-1].error_type == "insufficient_quota"
    assert _spent(gw, "key:") == [(3 * TOKENS, 0)]
    a.close()
    o.close()


def test_money_budgets_of_key_and_owner_settle_to_the_records_costs(gateway, upstream):
    owner = "team-" + secrets.token_hex(3)
    s1, k1 = _key(["1 USD/day"], owner=owner)
    s2, k2 = _key([], owner=owner)
    gw = gateway(keys=[k1, k2], prices=PRICES, budgets={"owners": {owner: ["0.0002 USD/day"]}})
    upstream.script = lambda body: Reply(
        text="ok words here", prompt_tokens=100, completion_tokens=7
    )
    statuses = []
    for i in range(6):
        secret = (s1, s2)[i % 2]
        r = _chat(gw, secret, stream=True)
        statuses.append(r.status_code)
        if r.status_code == 200:
            assert "x-budget-remaining-usd" in r.headers
        _wait_settled(gw)
    # the owner's 200,000 nanos hold two requests' 153,600 and admit a third: 230,400
    assert statuses == [200, 200, 200, 429, 429, 429]
    recs = gw.records
    assert all(r.cost_nano == COST for r in recs if r.status == 200)
    owner_spent = [s for s in _spent(gw, f"owner:{owner}:USD")]
    assert owner_spent == [(sum(r.cost_nano or 0 for r in recs), 0)]
    assert recs[3].error_type == "insufficient_quota" and recs[3].key_owner == owner


def test_two_gateways_share_a_budget_through_redis(gateway, upstream):
    secret, key = _key(["500 tokens/day"])
    g1 = gateway(keys=[key], budgets={"shared": REDIS_URL})
    g2 = gateway(keys=[key], budgets={"shared": REDIS_URL})
    statuses = []
    for i in range(8):
        gw = (g1, g2)[i % 2]
        r = _chat(gw, secret, max_tokens=8)
        statuses.append(r.status_code)
        _wait_settled(gw)
    assert statuses == [200] * 5 + [429] * 3  # 5 * 107 = 535 crosses 500 on the fifth

    async def read():
        led = RedisCounters(REDIS_URL)
        try:
            day = time.strftime("%Y-%m-%d", time.gmtime())
            return await led.read([f"key:{key['name']}:tokens:day:{day}"])
        finally:
            await led.aclose()

    assert asyncio.run(read()) == [(5 * TOKENS, 0)]


def test_a_restart_keeps_what_was_spent(upstream, tmp_path):
    secret, key = _key(["250 tokens/day"])
    raw = {
        "channels": [{"name": "main", "base_url": upstream.url}],
        "keys": [key],
        "store": {"dsn": f"sqlite:///{tmp_path}/r.db", "journal_path": str(tmp_path / "j")},
    }

    with ServerThread(create_app(parse_config(raw))) as gw:
        assert [_chat(gw, secret).status_code for _ in range(2)] == [200, 200]
    with open_store(f"sqlite:///{tmp_path}/r.db") as store:
        assert store.count() == 2
    with ServerThread(create_app(parse_config(raw))) as gw:
        # seeded with 214 tokens: room for one more, then spent
        assert [_chat(gw, secret).status_code for _ in range(2)] == [200, 429]
