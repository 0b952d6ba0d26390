"""A session's turns through the gateway cost what is new in them (the conversion and the
segments of what a turn re-sends are lent by the turn before), and come out exactly as if
each turn were alone: the upstream gets the same request, the record the same segments,
also when the client edits its history or compacts it."""

from __future__ import annotations

import copy
import json

import httpx
import msgspec

from prefixgate import hygiene
from prefixgate.apis.messages.request import ConvertOptions, anthropic_to_openai, convert
from prefixgate.config import Limits, parse_config
from prefixgate.lab.traffic.claude_code import ClaudeCodeSession
from prefixgate.lab.traffic.spec import AGENT_CLAUDE_CODE, TrafficSpec
from prefixgate.protocol.messages_body import decode_messages_body
from prefixgate.record.capture import Capturer
from prefixgate.record.record import Record
from prefixgate.record.segments import segments_anthropic, segments_openai
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from tests.conftest import ListRecorder, settled


def _session_turns() -> list[list[dict]]:
    spec = TrafficSpec(
        sessions=1,
        turns=14,
        titles=False,
        tools_kb=8,
        system_kb=2,
        tool_result_chars=(200, 3000),
        compact_chars=40_000,  # a compaction on the way: the history replaced
        mix={AGENT_CLAUDE_CODE: 1.0},
        models=("m",),
    )
    turns = [[r.body, r.headers] for r in ClaudeCodeSession(spec, 7).requests()]
    # the client edits its history: an earlier message changes, and the turn after re-sends
    # the edited one
    for k in (8, 9):
        body = turns[k][0] = copy.deepcopy(turns[k][0])
        body["messages"][0]["content"][-1]["text"] += " (edited)"
    return turns


def test_each_turn_goes_upstream_and_into_the_record_as_if_it_were_alone(upstream):
    config = parse_config(
        {
            "channels": [{"name": "main", "base_url": upstream.url, "render_order": "tools_first"}],
            "store": None,
        }
    )
    recorder = ListRecorder()
    app = create_app(config, recorder=recorder, capture=Capturer())
    gateway = app.state.gateway
    turns = _session_turns()
    with ServerThread(app) as srv, httpx.Client(timeout=30) as client:
        for body, headers in turns:
            r = client.post(
                srv.url + "/v1/messages?beta=true",
                content=json.dumps(body).encode(),
                headers={k: v for k, v in headers.items() if k.lower() != "content-length"},
            )
            assert r.status_code == 200, r.text
        settled(gateway)
    assert len(gateway.turns) == 1  # the session's latest turn, kept
    orders = gateway.render_orders
    sent = upstream.requests
    assert len(sent) == len(turns) == len(recorder.records)
    for (body, _), got, rec in zip(turns, sent, recorder.records, strict=True):
        hygienic = hygiene.apply_plain(copy.deepcopy(body), config.channels[0], orders)
        alone = anthropic_to_openai(hygienic, ConvertOptions(upstream_model="m"))
        assert got == alone
        assert rec.segments_in == segments_anthropic(body)
        assert rec.segments_out == segments_openai(alone, tools_first=True)
    # the change memory says what it says of the same turns converted and cut alone
    alone_capture, ch = Capturer(), config.channels[0]
    for (body, _), rec in zip(turns, recorder.records, strict=True):
        raw = json.dumps(body).encode()
        decoded = decode_messages_body(raw, Limits())
        out = convert(
            hygiene.apply_typed(decoded.typed, ch, orders), ConvertOptions(upstream_model="m")
        )
        fresh = Record(
            request_id=rec.request_id, received_at=0.0, endpoint="messages",
            session_id=rec.session_id, client=rec.client, client_version=rec.client_version,
        )  # fmt: skip
        alone_capture(fresh, decoded, out, ch, None, raw, msgspec.json.encode(out), orders=orders)
        assert (fresh.segments_out, fresh.compared, fresh.change) == (
            rec.segments_out, rec.compared, rec.change,
        )  # fmt: skip
    # the edited turns broke the prefix where the edit was, and the record says so
    edited = recorder.records[8]
    assert edited.change is not None and edited.change.segment == "messages[0]:user"
    assert recorder.records[9].change is None  # the edit re-sent as it was: no break
