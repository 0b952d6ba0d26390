"""The whole app on the in-memory transport: one failover loop for both entry points."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from prefixgate.config import parse_config
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.upstream.transport import FakeReply, FakeTransport
from tests.conftest import ListRecorder, settled

ANSWER = {
    "id": "x",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 9, "completion_tokens": 1},
}


@pytest.fixture
def stack():
    sent: list[str] = []

    def handler(method, url, headers, body):
        if url.endswith("/tokenize"):  # the gateway learning the render order: none here
            return FakeReply.json({"error": {"message": "not found"}}, status=404)
        sent.append(url)
        if url.startswith("http://down"):
            return FakeReply.json({"error": {"message": "overloaded"}}, status=503)
        return FakeReply.json({**ANSWER, "model": json.loads(body)["model"]})

    fake = FakeTransport(handler)
    config = parse_config(
        {
            "channels": [
                {"name": "down", "base_url": "http://down/v1", "priority": 2},
                {"name": "up", "base_url": "http://up/v1", "priority": 1},
            ],
            "store": None,
        }
    )
    recorder = ListRecorder()
    app = create_app(config, upstream=fake, recorder=recorder)
    with ServerThread(app) as srv:
        yield srv, sent, recorder, app.state.gateway


def test_both_entry_points_fail_over_the_same_way(stack):
    srv, sent, recorder, gateway = stack
    with anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0) as client:
        msg = client.messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0) as chat:
        completion = chat.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    assert msg.content[0].text == "ok" and completion.choices[0].message.content == "ok"
    # The second request skips the ejected channel: it failed a moment ago.
    assert sent == [
        "http://down/v1/chat/completions",
        "http://up/v1/chat/completions",
        "http://up/v1/chat/completions",
    ]
    settled(gateway)
    assert [(r.endpoint, r.channel, r.retries, r.status) for r in recorder.records] == [
        ("messages", "up", 1, 200),
        ("chat", "up", 0, 200),
    ]
