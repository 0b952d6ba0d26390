"""The relays alone, on a fake upstream response and a scripted client: what the client
receives, what the record says, and that the upstream is closed and the record finished
exactly once however the answer ends."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from starlette.requests import ClientDisconnect, Request

from prefixgate.apis.chat.endpoint import ENDPOINT as CHAT
from prefixgate.apis.chat.steps import relay_chat
from prefixgate.apis.messages.endpoint import ENDPOINT as MESSAGES
from prefixgate.apis.messages.steps import relay_messages
from prefixgate.config import parse_config
from prefixgate.gateway import Gateway
from prefixgate.pipeline import Exchange
from prefixgate.protocol.messages_body import decode_messages_body
from prefixgate.routing.channels import Target
from prefixgate.upstream.transport import FakeReply, FakeResponse
from tests.conftest import ListRecorder

CONFIG = parse_config({"channels": [{"name": "c", "base_url": "http://up/v1"}], "store": None})
ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}


def _delta(text: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


DONE = {
    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    "usage": {
        "prompt_tokens": 50,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 32},
    },
}


def _exchange(
    endpoint, body: dict, reply: FakeReply
) -> tuple[Exchange, FakeResponse, ListRecorder]:
    recorder = ListRecorder()
    gw = Gateway.from_config(CONFIG, recorder=recorder)
    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}
    x = Exchange(gw, Request(scope), endpoint)
    raw = json.dumps(body).encode()
    x.body = decode_messages_body(raw, CONFIG.limits) if endpoint is MESSAGES else body
    x.record.stream = bool(body.get("stream"))
    x.target = Target(CONFIG.channels[0], "http://up/v1")
    x.out = {"model": body["model"]}
    resp = FakeResponse(reply)
    x.upstream = resp
    first = resp._chunks.pop(0)
    x.first = first if x.record.stream else json.loads(first)
    return x, resp, recorder


class Client:
    """An ASGI client that takes the response's messages, and can leave after ``leave_after``
    body messages (its next send then fails, as a closed socket's does)."""

    def __init__(self, leave_after: int | None = None) -> None:
        self.messages: list[dict] = []
        self.leave_after = leave_after

    async def send(self, message: dict) -> None:
        bodies = sum(1 for m in self.messages if m["type"] == "http.response.body")
        if self.leave_after is not None and bodies >= self.leave_after:
            raise OSError("client went away")
        self.messages.append(message)

    async def receive(self) -> dict:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    @property
    def body(self) -> bytes:
        return b"".join(
            m.get("body", b"") for m in self.messages if m["type"] == "http.response.body"
        )

    @property
    def status(self) -> int:
        return self.messages[0]["status"]


def _answer(x: Exchange, relay, client: Client) -> None:
    async def go():
        response = await relay(x)
        scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
        with contextlib.suppress(ClientDisconnect):  # what Starlette makes of a failed send
            await response(scope, client.receive, client.send)

    asyncio.run(go())


MSG = {
    "model": "m",
    "max_tokens": 10,
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
}


def test_a_stream_is_converted_and_recorded_once():
    x, resp, recorder = _exchange(
        MESSAGES, MSG, FakeReply.sse(ROLE, _delta("Hello"), _delta(" there"), DONE, b"[DONE]")
    )
    client = Client()
    _answer(x, relay_messages, client)
    events = [line for line in client.body.decode().splitlines() if line.startswith("event: ")]
    assert events[0] == "event: message_start" and events[-1] == "event: message_stop"
    assert "Hello" in client.body.decode() and " there" in client.body.decode()
    assert resp.closed
    [rec] = recorder.records
    assert (rec.status, rec.prompt_tokens, rec.cached_tokens) == (200, 50, 32)
    assert rec.reported_cache_read_tokens == 32
    assert x.gateway.open_records == 0
    assert dict(client.messages[0]["headers"])[b"request-id"] == rec.request_id.encode()


def test_a_client_that_leaves_mid_stream_leaves_a_499_and_the_upstream_closed():
    x, resp, recorder = _exchange(
        MESSAGES, MSG, FakeReply.sse(ROLE, _delta("a"), _delta("b"), _delta("c"), DONE)
    )
    # Chunks go out one read at a time: leave after the first body write.
    client = Client(leave_after=1)
    _answer(x, relay_messages, client)
    assert resp.closed
    [rec] = recorder.records
    assert (rec.status, rec.error_type) == (499, "client_disconnected")


def test_an_upstream_error_mid_stream_becomes_an_error_event():
    err = {"object": "error", "message": "engine died", "type": "InternalServerError", "code": 500}
    x, resp, recorder = _exchange(MESSAGES, MSG, FakeReply.sse(ROLE, _delta("partial"), err))
    client = Client()
    _answer(x, relay_messages, client)
    body = client.body.decode()
    assert client.status == 200 and "event: error" in body and "engine died" in body
    [rec] = recorder.records
    assert rec.status == 502 and resp.closed


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_stream_hides_the_usage_chunk_it_was_not_asked_for(include_usage):
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    usage_only = {"choices": [], "usage": DONE["usage"]}
    stop = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    x, resp, recorder = _exchange(
        CHAT, body, FakeReply.sse(ROLE, _delta("x"), stop, usage_only, b"[DONE]")
    )
    client = Client()
    _answer(x, relay_chat, client)
    datas = [line[6:] for line in client.body.decode().splitlines() if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    assert any('"usage"' in d for d in datas) == include_usage
    [rec] = recorder.records
    assert (rec.status, rec.prompt_tokens, rec.cached_tokens) == (200, 50, 32)
    assert dict(client.messages[0]["headers"])[b"x-request-id"] == rec.request_id.encode()


def test_chat_once_with_an_error_in_a_200_answers_the_error():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    err = {"error": {"message": "bad things", "type": "server_error"}}
    x, resp, recorder = _exchange(CHAT, body, FakeReply.json(err))
    client = Client()
    _answer(x, relay_chat, client)
    assert client.status == 502 and json.loads(client.body)["error"]["message"].endswith(
        "bad things"
    )
    [rec] = recorder.records
    assert rec.status == 502


def _chat_datas(client: Client) -> list[bytes]:
    return [line[6:] for line in client.body.split(b"\n") if line.startswith(b"data: ")]


def test_chat_chunks_go_out_as_the_upstream_wrote_them_with_the_public_model_name():
    """Chunks without usage or errors are not decoded: their bytes (key order, numbers,
    escapes) reach the client as they came, the upstream's model name swapped for the one
    the client asked for; the others are decoded and rewritten as before."""
    body = {"model": "public", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    raw = [
        b'{"id":"c1","object":"chat.completion.chunk","created":1.50,"model":"up/m-1",'
        b'"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
        # A content chunk that mentions the model and "usage" in its text: still as it came.
        b'{"id":"c1","model":"up/m-1","choices":[{"index":0,"delta":'
        b'{"content":"the \\"usage\\" of \\"model\\":\\"up/m-1\\" \\u00e9"}}]}',
        # Another spelling of the model field: decoded, rewritten.
        b'{"id":"c1","model": "up/m-1","choices":[{"index":0,"delta":{"content":"x"}}]}',
        b'{"id":"c1","choices":[{"index":0,"delta":{"content":"y"}}]}',
        b'{"id":"c1","model":"up/m-1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
        b'"usage":null}',
        b'{"id":"c1","model":"up/m-1","choices":[],"usage":{"prompt_tokens":5,'
        b'"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}',
        b"[DONE]",
    ]
    x, resp, recorder = _exchange(CHAT, body, FakeReply.sse(*raw))
    x.out = {"model": "up/m-1"}
    client = Client()
    _answer(x, relay_chat, client)
    datas = _chat_datas(client)
    assert datas[0] == raw[0].replace(b'"model":"up/m-1"', b'"model":"public"')
    assert datas[1] == raw[1].replace(b'"model":"up/m-1"', b'"model":"public"', 1)
    assert b"\\u00e9" in datas[1] and b'\\"model\\":\\"up/m-1\\"' in datas[1]
    assert json.loads(datas[2])["model"] == "public"
    assert datas[3] == raw[3]
    assert json.loads(datas[4]) == {
        "id": "c1",
        "model": "public",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    }  # the usage the client did not ask for is not shown
    assert datas[5:] == [b"[DONE]"]  # nor the usage-only chunk
    assert b"up/m-1" not in client.body.replace(b'\\"up/m-1\\"', b"")
    [rec] = recorder.records
    assert (rec.status, rec.prompt_tokens, rec.cached_tokens) == (200, 5, 4)


@pytest.mark.parametrize("relay", ["chat", "messages"])
def test_a_stream_cut_anywhere_into_reads_gives_the_same_answer(relay):
    """However the upstream's bytes are split into reads (an event across two reads, many
    events in one), the client gets the same events and the record the same usage."""
    endpoint, fn, body = (
        (CHAT, relay_chat, {**MSG, "stream_options": {"include_usage": True}})
        if relay == "chat"
        else (MESSAGES, relay_messages, MSG)
    )
    whole = b"".join(
        FakeReply.sse(ROLE, _delta("Hel"), _delta("lo \u00e9"), DONE, b"[DONE]").chunks
    )

    def run(size: int) -> tuple[list[bytes], tuple]:
        pieces = [whole[i : i + size] for i in range(0, len(whole), size)]
        reply = FakeReply(200, {"content-type": "text/event-stream"}, pieces)
        x, _, recorder = _exchange(endpoint, body, reply)
        client = Client()
        _answer(x, fn, client)
        [rec] = recorder.records
        events = [e for e in client.body.split(b"\n\n") if e]
        if relay == "messages":  # ids are random per answer
            events = [e for e in events if b"message_start" not in e]
        return events, (rec.status, rec.prompt_tokens, rec.cached_tokens)

    expected = run(len(whole))
    assert expected[1] == (200, 50, 32)
    for size in (1, 2, 3, 7, 16, 61, 200):
        assert run(size) == expected, size


def test_a_read_with_lone_cr_line_ends_is_decoded_not_passed_as_one_event():
    """SSE lets a lone CR end a line: a read whose only LF is at its end may still hold two
    events, and the usage in the second must reach the record."""
    body = {**MSG, "stream_options": {"include_usage": True}}
    read = b"data: " + json.dumps(_delta("x")).encode() + b"\r\r"
    read += b"data: " + json.dumps(DONE).encode() + b"\n\n"
    reply = FakeReply(200, {"content-type": "text/event-stream"}, [read, b"data: [DONE]\n\n"])
    x, _, recorder = _exchange(CHAT, body, reply)
    client = Client()
    _answer(x, relay_chat, client)
    [rec] = recorder.records
    assert (rec.status, rec.prompt_tokens, rec.cached_tokens) == (200, 50, 32)
    assert _chat_datas(client)[-1] == b"[DONE]"
