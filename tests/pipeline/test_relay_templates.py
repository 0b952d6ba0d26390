"""Chunk templates (``convert/template.py``) change what a relay decodes, never what the
client gets: on generated streams (engine shapes, pieces with quotes, escapes, control
characters and the keys the chat relay looks for; reads of one event, of several, of
part of one; chunks that match a template's ends around something that is not one JSON
string), each relay gives the same bytes, errors and record with templates as without
them (the decoding path, as it was before templates)."""

from __future__ import annotations

import contextlib
import itertools
from unittest import mock

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixgate.apis.chat.endpoint import ENDPOINT as CHAT
from prefixgate.apis.chat.steps import ChatRelay
from prefixgate.apis.messages import steps as messages_steps
from prefixgate.apis.messages.endpoint import ENDPOINT as MESSAGES
from prefixgate.apis.messages.steps import messages_stream
from prefixgate.apis.responses import stream as responses_stream
from prefixgate.apis.responses.stream import ResponsesStream
from prefixgate.convert.template import Template
from prefixgate.errors import GatewayError
from prefixgate.pipeline.relays import Converted
from prefixgate.upstream.transport import FakeReply
from tests.pipeline.test_relays import MSG, _exchange

_enc = msgspec.json.encode
pieces = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["usage", "error", "model", "", '"', "\\", "a\nb", "\x00", "é€😀", "#"]),
)
# What may stand where a template's string is: not always one JSON string.
odd_tokens = st.sampled_from(
    [
        b"123",
        b"null",
        b'"a" ',
        b' "a"',
        b'"a"\n',
        b'"a\nb"',
        b'"\xff"',
        b'"a\x01"',
        b'"a","usage":{"prompt_tokens":3}',
        b'"a"},"finish_reason":"stop","x":{"y":"b',
        b'"\\u0041\\"usage\\""',
        b'""',
        b'"',
    ]
)


def _shape(engine: str, model: str, delta: dict | None, finish=None, usage=None) -> bytes:
    """A chunk as vLLM or SGLang writes it (compact JSON, fields in their order)."""
    choice: dict = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if engine == "sglang":
        choice["delta"] = {
            "role": None,
            "content": None,
            "reasoning_content": None,
            **(delta or {}),
        }
        choice["matched_stop"] = None
    chunk: dict = {
        "id": "chatcmpl-7",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": model,
        "choices": [] if usage else [choice],
    }
    if usage or engine == "sglang":
        chunk["usage"] = usage
    return _enc(chunk)


@st.composite
def streams(draw) -> tuple[str, list[bytes]]:
    engine = draw(st.sampled_from(["vllm", "sglang"]))
    model = draw(st.sampled_from(["m", "up/m-1"]))
    datas = [_shape(engine, model, {"role": "assistant", "content": ""})]
    tool = 0
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["text"] * 4 + ["reasoning"] * 2 + ["odd", "tool", "fin"]))
        if kind in ("text", "reasoning"):
            key = (
                "content"
                if kind == "text"
                else draw(st.sampled_from(["reasoning_content", "reasoning"]))
            )
            datas.append(_shape(engine, model, {key: draw(pieces)}))
        elif kind == "odd":
            good = _shape(engine, model, {"content": "TOKEN"})
            datas.append(good.replace(b'"TOKEN"', draw(odd_tokens)))
        elif kind == "tool":
            tool += 1
            call = {"index": 0, "id": f"call_{tool}", "function": {"name": "f", "arguments": "{}"}}
            datas.append(_shape(engine, model, {"tool_calls": [call]}))
        else:
            datas.append(_shape(engine, model, {}, finish="stop"))
    usage = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
    datas += [_shape(engine, model, {}, "stop"), _shape(engine, model, None, usage=usage)]
    datas.append(b"[DONE]")
    whole = [b"data: " + d + b"\n\n" for d in datas]
    # Reads: mostly one event each; some joined, some cut.
    reads: list[bytes] = []
    i = 0
    while i < len(whole):
        how = draw(st.sampled_from(["one"] * 6 + ["two", "cut"]))
        if how == "two" and i + 1 < len(whole):
            reads.append(whole[i] + whole[i + 1])
            i += 2
        elif how == "cut":
            at = draw(st.integers(1, len(whole[i]) - 1))
            reads += [whole[i][:at], whole[i][at:]]
            i += 1
        else:
            reads.append(whole[i])
            i += 1
    return model, reads


def _ids():
    count = itertools.count()
    return lambda prefix: f"{prefix}_{next(count)}"


@contextlib.contextmanager
def same_ids():
    """The ids a relay makes, the same on every run (to compare two runs' bytes)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(responses_stream, "new_id", _ids())
        mp.setattr(messages_steps, "message_id", lambda _: "msg_1")
        yield


def _run(relay, reads: list[bytes]) -> list:
    """What the client gets of each read, then of the end (or the failure)."""
    got: list = []
    try:
        for read in reads:
            got.append(relay.feed(read))
            if relay.done:
                break
        got.append(relay.end())
    except GatewayError as e:
        got.append((type(e).__name__, str(e), relay.fail(e)))
    rec = relay.rec
    got.append((rec.status, rec.prompt_tokens, rec.completion_tokens, rec.first_byte_at is None))
    return got


def _relays(kind: str, model: str, reads: list[bytes], templates: bool):
    body = {**MSG, "model": model, "stream_options": {"include_usage": True}}
    x, _, _ = _exchange(MESSAGES if kind != "chat" else CHAT, body, FakeReply.sse(b"{}"))
    if kind == "chat":
        relay = ChatRelay(x)
        relay.learning = relay.learning if templates else 0
        return relay
    if kind == "messages":
        relay = messages_stream(x).relay
    else:
        relay = Converted(x, ResponsesStream({"id": "resp_1", "model": model}, {}), lambda u: None)
    relay.conv.learning = relay.conv.learning if templates else 0
    return relay


@pytest.mark.parametrize("kind", ["chat", "messages", "responses"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams())
def test_templates_send_the_same_bytes_as_decoding(kind, stream) -> None:
    model, reads = stream
    results = []
    for templates in (True, False):
        with same_ids():
            relay = _relays(kind, model, reads, templates)
            results.append((_run(relay, reads), relay))
    (new, _), (old, _) = results
    assert new == old


@contextlib.contextmanager
def _calls_of(relay, name: str):
    """What ``relay``'s method ``name`` (its way of decoding) is called with meanwhile,
    watched on its class (a relay has slots: no method of its own can be set)."""
    calls: list = []
    cls = type(relay)
    inner = getattr(cls, name)

    def watched(self, data):
        if self is relay:
            calls.append(data)
        return inner(self, data)

    with mock.patch.object(cls, name, watched):
        yield calls


@pytest.mark.parametrize("kind", ["chat", "messages"])
def test_after_its_first_piece_a_vllm_stream_is_not_decoded(kind) -> None:
    """The bulk of a stream: once its first content chunk is seen, the rest go out from
    their bytes, neither decoded nor searched."""
    role = b"data: " + _shape("vllm", "m", {"role": "assistant", "content": ""}) + b"\n\n"
    reads = [b"data: " + _shape("vllm", "m", {"content": f" w{i}"}) + b"\n\n" for i in range(50)]
    relay = _relays(kind, "m", reads, True)
    relay.feed(role)
    relay.feed(reads[0])
    with _calls_of(relay, "_plain" if kind == "chat" else "_events") as calls:
        out = [relay.feed(r) for r in reads[1:]]
    assert calls == []
    key = b'"content":' if kind == "chat" else b'"text":'
    assert all(key + b'" w%d"' % i in o for i, o in enumerate(out, 1))


@pytest.mark.parametrize("kind", ["chat", "messages"])
@settings(max_examples=100, deadline=None)
@given(token=st.one_of(odd_tokens, pieces.map(_enc)))
def test_a_relay_takes_a_read_from_its_bytes_when_template_piece_reads_it(kind, token) -> None:
    """The relays match a read against a template inline (``Template.ends``): they take
    it from its bytes exactly when :meth:`Template.piece` gives its string (a non-empty
    one for a converted stream; for chat, any but the keys it looks for)."""
    good = _shape("vllm", "m", {"content": "TOKEN"})
    role = b"data: " + _shape("vllm", "m", {"role": "assistant", "content": ""}) + b"\n\n"
    read = b"data: " + good.replace(b'"TOKEN"', token) + b"\n\n"
    relay = _relays(kind, "m", [], True)
    relay.feed(role)
    relay.feed(b"data: " + good + b"\n\n")
    (template,) = (
        relay.conv.templates
        if kind == "messages"
        else [Template(*relay.templates[0][0:3:2], "text", b"")]
    )
    piece = template.piece(read)
    with _calls_of(relay, "_plain" if kind == "chat" else "_events") as calls:
        with contextlib.suppress(GatewayError):
            relay.feed(read)
    if kind == "chat":
        quick = piece is not None and piece not in ("usage", "error", "model")
    else:
        quick = bool(piece)
    assert (calls == []) == quick, (token, piece)
