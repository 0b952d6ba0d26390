"""Row 6 of the security review (issue 29): count_tokens goes through the same
authentication, limits, admission and budgets as inference, is recorded, and a large body
is decoded and counted off the event loop."""

from __future__ import annotations

import hashlib
import threading

import anthropic
import pytest

from prefixgate.config import parse_config
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from tests.conftest import ListRecorder

MESSAGES = [{"role": "user", "content": "count me"}]


def test_a_key_over_its_budget_gets_no_count(gateway):
    gw = gateway(
        keys=[
            {
                "name": "alice",
                "key_sha256": hashlib.sha256(b"k").hexdigest(),
                "budgets": ["10 tokens/day"],
            }
        ]
    )
    client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
    client.messages.create(model="m", max_tokens=5, messages=MESSAGES)  # 107 tokens: spent
    assert len(gw.records) == 1  # settled: the budget knows
    with pytest.raises(anthropic.RateLimitError):
        client.messages.count_tokens(model="m", messages=MESSAGES)
    assert [(r.endpoint, r.status) for r in gw.records] == [
        ("messages", 200),
        ("count_tokens", 429),
    ]


def test_count_tokens_is_rate_limited_and_recorded(gateway):
    gw = gateway(keys=[{"name": "alice", "key_sha256": hashlib.sha256(b"k").hexdigest(), "rpm": 2}])
    client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
    for _ in range(2):
        assert client.messages.count_tokens(model="m", messages=MESSAGES).input_tokens > 0
    with pytest.raises(anthropic.RateLimitError):
        client.messages.count_tokens(model="m", messages=MESSAGES)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=gw.url, api_key="wrong", max_retries=0).messages.count_tokens(
            model="m", messages=MESSAGES
        )
    records = gw.records
    assert [r.status for r in records] == [200, 200, 429, 401]
    assert all(r.endpoint == "count_tokens" for r in records)
    assert records[0].key_name == "alice" and records[0].requested_model == "m"
    assert gw.upstream.requests == []  # nothing goes upstream


def test_a_large_body_is_counted_off_the_event_loop(upstream):
    """The counter runs on another thread than the event loop's for a large body, on the
    loop's own for a small one (where a thread would cost more than the count)."""
    seen: list[tuple[int, int]] = []

    def counter(body, channel) -> int:
        import asyncio

        try:
            loop_thread = asyncio.get_running_loop() and threading.get_ident()
        except RuntimeError:
            loop_thread = None
        seen.append((len(str(body)), loop_thread is not None))
        return 7

    config = parse_config({"channels": [{"name": "main", "base_url": upstream.url}], "store": None})
    app = create_app(config, recorder=ListRecorder(), token_counter=counter)
    with ServerThread(app) as srv:
        client = anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0)
        client.messages.count_tokens(model="m", messages=MESSAGES)
        big = [{"role": "user", "content": "word " * 200_000}]
        assert client.messages.count_tokens(model="m", messages=big).input_tokens == 7
    assert [on_loop for _, on_loop in seen] == [True, False]
