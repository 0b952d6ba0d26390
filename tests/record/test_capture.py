"""The capture step: segments from the request bytes equal those from the objects, for
each way a request goes (Messages to an OpenAI upstream, chat passed through)."""

from __future__ import annotations

import json

import msgspec
import pytest

from prefixgate.apis.messages.request import ConvertOptions, anthropic_to_openai
from prefixgate.config import parse_config
from prefixgate.engine.order import RenderOrders
from prefixgate.protocol.openai import decode_chat_body
from prefixgate.record.capture import Capturer
from prefixgate.record.record import Record
from tests.conftest import FIXTURES

NAMES = sorted(p.name for p in FIXTURES.glob("*.json"))


def _body(name: str) -> dict:
    body = json.loads((FIXTURES / name).read_text())["body"]
    return json.loads(body) if isinstance(body, str) else body


def _capture(endpoint: str, body_in, body_out, raw_in, raw_out, **channel) -> Record:
    config = parse_config({"channels": [{"name": "c", "base_url": "http://u/v1", **channel}]})
    rec = Record(request_id="r", received_at=0.0, endpoint=endpoint)
    Capturer()(
        rec, body_in, body_out, config.channels[0], None, raw_in, raw_out, orders=RenderOrders()
    )
    return rec


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("order", ["tools_first", "system_first"])
def test_messages_to_an_openai_upstream_bytes_and_objects_agree(name, order):
    body = _body(name)
    out = anthropic_to_openai(body, ConvertOptions(upstream_model="m"))
    raw_in, raw_out = json.dumps(body).encode(), msgspec.json.encode(out)
    by_bytes = _capture("messages", body, out, raw_in, raw_out, render_order=order)
    by_objects = _capture("messages", body, out, None, None, render_order=order)
    assert by_bytes.segments_in == by_objects.segments_in and by_bytes.segments_in
    assert by_bytes.segments_out == by_objects.segments_out and by_bytes.segments_out


_ESCAPED = (
    b'{"model":"m","max_tokens":9,"system":[{"type":"text","text":"caf\\u00e9 \\/ \\n"}],'
    b'"tools":[{"name":"t","description":"\\u00e9","input_schema":{"type":"object"}}],'
    b'"messages":[{"role":"user","content":[{"type":"text","text":"a\\tb"},'
    b'{"type":"text","text":"\\ud83d\\ude00"}]}]}'
)


@pytest.mark.parametrize("raw_in", [*(json.dumps(_body(n)).encode() for n in NAMES), _ESCAPED])
@pytest.mark.parametrize("order", ["tools_first", "system_first"])
def test_messages_as_the_gateway_converts_them_agree_with_the_objects(raw_in, order):
    """The gateway's typed request and its chat request with raw texts (their pieces
    encoded one by one) give the segments the plain objects give."""
    from prefixgate.apis.messages.request import convert
    from prefixgate.protocol.messages_body import decode_messages_body

    config = parse_config({"channels": [{"name": "c", "base_url": "http://u/v1"}]})
    body = decode_messages_body(raw_in, config.limits)
    out = convert(body.typed, ConvertOptions(upstream_model="m"))
    raw_out = msgspec.json.encode(out)
    fast = _capture("messages", body, out, raw_in, raw_out, render_order=order)
    plain_in = json.loads(raw_in)
    plain_out = anthropic_to_openai(plain_in, ConvertOptions(upstream_model="m"))
    slow = _capture("messages", plain_in, plain_out, None, None, render_order=order)
    assert fast.segments_in == slow.segments_in and fast.segments_in
    assert fast.segments_out == slow.segments_out and fast.segments_out


@pytest.mark.parametrize("name", NAMES)
def test_chat_passed_through_bytes_and_objects_agree(name):
    config = parse_config({"channels": [{"name": "c", "base_url": "http://u/v1"}]})
    chat = anthropic_to_openai(_body(name), ConvertOptions(upstream_model="m"))
    raw_in = json.dumps(chat).encode()
    body = decode_chat_body(raw_in, config.limits)  # messages and tools left raw
    out = {**body, "model": "upstream-name"}
    raw_out = msgspec.json.encode(out)
    by_bytes = _capture("chat", body, out, raw_in, raw_out)
    by_objects = _capture("chat", body, out, None, None)
    assert by_bytes.segments_in == by_objects.segments_in and by_bytes.segments_in
    assert by_bytes.segments_out == by_objects.segments_out == by_objects.segments_in


def test_texts_opted_in_take_the_object_way_and_give_the_same_hashes():
    body = _body(NAMES[0])
    out = anthropic_to_openai(body, ConvertOptions(upstream_model="m"))
    raw_in, raw_out = json.dumps(body).encode(), msgspec.json.encode(out)
    plain = _capture("messages", body, out, raw_in, raw_out)
    with_texts = _capture("messages", body, out, raw_in, raw_out, capture_text=True)
    assert with_texts.segments_in == plain.segments_in
    assert with_texts.texts and {s.hash for s in plain.segments_in} <= set(with_texts.texts)
