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
from tests.conftest import ListRecorder, captured_alike, settled


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
    for (body, _), got, raw, rec in zip(turns, sent, upstream.raw, recorder.records, strict=True):
        hygienic = hygiene.apply_plain(copy.deepcopy(body), config.channels[0], orders)
        alone = anthropic_to_openai(hygienic, ConvertOptions(upstream_model="m"))
        assert got == alone
        typed = decode_messages_body(json.dumps(hygienic).encode(), Limits()).typed
        assert raw == msgspec.json.encode(convert(typed, ConvertOptions(upstream_model="m")))
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


def _edited_turns(seed: int) -> list[list[dict]]:
    """A session's turns (a compaction and an edited message on the way, as above) with
    more edits: tools reordered, the system prompt changed, a system message that leads
    now, a message left out, a later system message."""
    turns = _session_turns() if seed == 7 else _session_turns_of(seed)
    edits = [
        lambda b: b.update(tools=b.get("tools", [])[::-1]),
        lambda b: b["system"][-1].update(text="the clock: 12:01"),
        lambda b: b["messages"].insert(0, {"role": "system", "content": "now it leads"}),
        lambda b: b["messages"].pop(1),
        lambda b: b["messages"].insert(2, {"role": "system", "content": "a later one"}),
    ]
    for k, edit in zip(range(3, len(turns), 2), edits, strict=False):
        body = turns[k][0] = copy.deepcopy(turns[k][0])
        edit(body)
    return turns


def _session_turns_of(seed: int) -> list[list[dict]]:
    spec = TrafficSpec(
        sessions=1, turns=12, titles=False, tools_kb=4, system_kb=1,
        tool_result_chars=(100, 2000), compact_chars=20_000, mix={AGENT_CLAUDE_CODE: 1.0},
        models=("m",),
    )  # fmt: skip
    return [[r.body, r.headers] for r in ClaudeCodeSession(spec, seed).requests()]


def test_a_sessions_capture_goes_on_from_its_previous_turn_as_a_whole_walk_gives():
    """Each turn's capture goes on from what the session's previous turn derived (its
    split pieces, its sums, its marks, the runs it lent): the records, the change memory's
    kept requests and its bytes equal those of a capture that walks every request whole,
    through edits, compactions, a changed system prompt and reordered tools."""
    from prefixgate.apis.messages.request import SessionTurns
    from prefixgate.config import ChannelConfig
    from prefixgate.engine.order import RenderOrders

    for seed in (7, 3):
        turns = _edited_turns(seed)
        for order in ("tools_first", "system_first"):
            ch = ChannelConfig(name="c", base_url="http://127.0.0.1:9/v1", render_order=order)
            orders, opts = RenderOrders(), ConvertOptions(upstream_model="m")
            lending, walking = Capturer(), Capturer()
            walking.changes.go_on = False
            convs = SessionTurns(1 << 30), SessionTurns(1 << 30)
            went_on = 0  # turns whose both sides went on from the previous turn's
            for k, (body, headers) in enumerate(turns):
                raw = json.dumps(body).encode()
                sid = headers["X-Claude-Code-Session-Id"]
                recs = []
                for cap, conv in zip((lending, walking), convs, strict=True):
                    decoded = decode_messages_body(raw, Limits(), conv, lambda _: sid)  # noqa: B023
                    typed = hygiene.apply_typed(decoded.typed, ch, orders)
                    out = conv.convert(("c", sid), typed, opts, len(raw))
                    rec = Record(
                        request_id=f"r{k}", received_at=0.0, endpoint="messages", session_id=sid
                    )
                    cap(rec, decoded, out, ch, None, raw, msgspec.json.encode(out), orders=orders)
                    recs.append(rec)
                for x, y in captured_alike(lending, walking, *recs):
                    assert x[-1].lent == y[-1].lent
                    _check_chat_size(x[-1].lent, x[-2].lent if len(x) > 1 else None)
                    if len(x) > 1 and x[-1].runs and x[-1].into[0] is x[-2].into[0]:
                        went_on += 1
            assert went_on > len(turns) // 2


def _check_chat_size(cut, previous) -> None:
    """A chat cut's size: a message lent (the previous turn's very object at the same
    place) counts its piece's characters, any other its bytes encoded, each 64 more, and
    the tools' bytes."""
    before = previous.messages if previous is not None else []
    size = 0
    for i, m in enumerate(cut.messages):
        lent = i < len(before) and before[i] is m
        size += cut.pieces[i][0].chars if lent else len(msgspec.json.encode(m))
    size += 64 * len(cut.messages) + sum(len(d or b"") for _, d in cut.tools_part)
    assert cut.size == size
    assert cut.chars == sum(p[0].chars for p in cut.pieces)


def test_a_sessions_upstream_body_takes_what_it_resends_from_its_previous_one():
    """``SessionTurns.encode``: each turn's upstream body is the bytes of encoding it alone,
    through edits, compactions, a changed system prompt and reordered tools; the messages
    re-sent as the previous turn's very objects (and the system message, and the tools
    list) are taken from the previous body, not encoded again."""
    from prefixgate.apis.messages.request import SessionTurns
    from prefixgate.config import ChannelConfig
    from prefixgate.engine.order import RenderOrders

    ch = ChannelConfig(name="c", base_url="http://127.0.0.1:9/v1")
    for seed in (7, 3):
        turns, orders = SessionTurns(1 << 30), RenderOrders()
        opts = ConvertOptions(upstream_model="m")
        lent = 0  # turns whose body took more than its head from the previous one
        for body, headers in _edited_turns(seed):
            raw = json.dumps(body).encode()
            sid = headers["X-Claude-Code-Session-Id"]
            decoded = decode_messages_body(raw, Limits(), turns, lambda _: sid)  # noqa: B023
            typed = hygiene.apply_typed(decoded.typed, ch, orders)
            out = turns.convert(("c", sid), typed, opts, len(raw))
            before = turns._d[("c", sid)].lent
            data = turns.encode(("c", sid), out)
            assert data == msgspec.json.encode(out)
            assert turns.encode(("c", sid), out) is data  # once a turn
            fresh = decode_messages_body(raw, Limits()).typed
            assert data == msgspec.json.encode(
                convert(hygiene.apply_typed(fresh, ch, orders), opts)
            )
            if before is not None and out["messages"] and out["messages"][0] is before.sent[0]:
                lent += 1
        assert lent > len(_edited_turns(seed)) // 2
        # a request the memory did not give is encoded as it is
        other = {"model": "m", "messages": [], "max_tokens": 1}
        assert turns.encode(("c", "nobody"), other) == msgspec.json.encode(other)


def test_each_codex_turn_goes_upstream_and_into_the_record_as_if_it_were_alone(upstream):
    """Codex CLI's turns (``/v1/responses``), edits on the way: each goes upstream as the
    bytes of its conversion alone, while the session's previous turn lends what it
    re-sends, and its record holds the segments of the request alone."""
    from prefixgate.apis.responses.request import convert as convert_responses
    from prefixgate.apis.responses.segments import segments_responses
    from prefixgate.protocol.responses import decode_responses_body
    from tests.record.test_responses_cut import _codex_turns, _edited

    config = parse_config({"channels": [{"name": "main", "base_url": upstream.url}], "store": None})
    recorder = ListRecorder()
    app = create_app(config, recorder=recorder, capture=Capturer())
    gateway = app.state.gateway
    turns = _edited(_codex_turns())
    with ServerThread(app) as srv, httpx.Client(timeout=30) as client:
        for body, headers in turns:
            r = client.post(
                srv.url + "/v1/responses", content=msgspec.json.encode(body), headers=headers
            )
            assert r.status_code == 200, r.text
        settled(gateway)
    sid = turns[0][1]["session-id"]
    assert ("responses", "main", sid) in gateway.turns._d  # the session's latest turn
    assert len(upstream.raw) == len(turns) == len(recorder.records)
    ch, orders = config.channels[0], gateway.render_orders
    for (body, _), raw, rec in zip(turns, upstream.raw, recorder.records, strict=True):
        typed = decode_responses_body(msgspec.json.encode(body), Limits()).typed
        alone = convert_responses(typed, ConvertOptions(upstream_model="m"))
        moved = hygiene.apply_chat(alone["messages"], ch, orders)
        if moved is not None:
            alone = {**alone, "messages": moved}
        assert raw == msgspec.json.encode(alone)
        assert rec.session_id == sid and rec.segments_in == segments_responses(body)
