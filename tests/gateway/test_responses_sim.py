"""``/v1/responses`` in front of the simulated vLLM (``prefixgate.lab.upstream_sim``, whose prefix
cache is the cache model): a Codex-shaped conversation over several turns through the
``openai`` SDK, with the bytes the upstream received, the cache hits the client was told
of, the captured segments; and a channel that passes Responses through to an upstream
that serves them itself (here another gateway)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from prefixgate.config import parse_config
from prefixgate.lab.upstream_sim import SimSettings, create_upstream_app
from prefixgate.record.capture import Capturer
from prefixgate.record.segments import first_changed
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from tests.conftest import FIXTURE_ROOT, ListRecorder, settled
from tests.fakes import RecordingUpstream

BLOCK = 32
DEVELOPER = "You are a coding agent. " * 60
TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Runs a command and returns its output.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string", "description": "The command."}},
            "required": ["cmd"],
            "additionalProperties": False,
        },
    },
    {
        "type": "namespace",
        "name": "agents",
        "description": "Sub-agents.",
        "tools": [
            {
                "type": "function",
                "name": "wait",
                "description": "Wait for an agent.",
                "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
            }
        ],
    },
    {"type": "web_search", "external_web_access": False},
]


class Stack:
    def __init__(self, url: str, upstream: RecordingUpstream, records: ListRecorder, gw) -> None:
        self.url, self.upstream, self.recorder, self.gateway = url, upstream, records, gw

    @property
    def records(self) -> list:
        settled(self.gateway)
        return self.recorder.records

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="k", max_retries=0)


def _gateway(channel: dict, **top) -> tuple[ServerThread, ListRecorder, object]:
    """A gateway (not started), its records, and its ``Gateway`` object."""
    config = parse_config({"channels": [{"name": "up", **channel}], "store": None, **top})
    records = ListRecorder()
    app = create_app(config, recorder=records, capture=Capturer())
    return ServerThread(app), records, app.state.gateway


@contextlib.contextmanager
def stack(**channel) -> Iterator[Stack]:
    upstream = RecordingUpstream(create_upstream_app(SimSettings(block_size=BLOCK)))
    with ServerThread(upstream) as up:
        server, records, gateway = _gateway(
            {"base_url": up.url + "/v1", "capture_text": True, **channel}
        )
        with server as gw:
            yield Stack(gw.url, upstream, records, gateway)


def _stream(client: openai.OpenAI, items: list, **kw):
    """One streamed turn: the output items as ``output_item.done`` gave them (what Codex
    keeps and sends back), and the final response."""
    done, final = [], None
    for ev in client.responses.create(
        model="sim-model", input=items, tools=TOOLS, stream=True, store=False, **kw
    ):
        if ev.type == "response.output_item.done":
            done.append(ev.item.model_dump(exclude_none=True))
        elif ev.type in ("response.completed", "response.incomplete", "response.failed"):
            final = ev.response
    assert final is not None and final.status == "completed", final
    return done, final


def _msg(role: str, text: str) -> dict:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def test_a_codex_shaped_conversation_keeps_its_prefix_and_hits_the_cache():
    with stack() as s, s.client() as client:
        items = [
            _msg("developer", DEVELOPER),
            _msg("user", "<environment_context><cwd>/w</cwd></environment_context>"),
            _msg("user", "list the files, please [[call:exec_command]]"),
        ]
        out1, r1 = _stream(client, items, prompt_cache_key="s1")
        (call,) = [i for i in out1 if i["type"] == "function_call"]
        assert call["name"] == "exec_command" and "cmd" in json.loads(call["arguments"])
        items += out1
        items.append({"type": "function_call_output", "call_id": call["call_id"], "output": "a b"})
        out2, r2 = _stream(client, items, prompt_cache_key="s1")
        assert [i["type"] for i in out2] == ["message"]
        items += out2
        items.append(_msg("user", "and once more"))
        out3, r3 = _stream(client, items, prompt_cache_key="s1")
        chats = s.upstream.chats()
        records = s.records
    assert len(chats) == 3 and [r.status for r in records] == [200, 200, 200]
    # each request's messages begin with the previous request's, byte for byte: the
    # function call comes back as the assistant message it was, the developer text is the
    # system message, nothing volatile went upstream
    for prev, cur in zip(chats, chats[1:], strict=False):
        n = len(prev["body"]["messages"])
        assert cur["body"]["messages"][:n] == prev["body"]["messages"]
        head = json.dumps(prev["body"]["messages"], ensure_ascii=False, separators=(",", ":"))
        assert head[:-1] in cur["raw"].decode()
        assert cur["body"]["tools"] == prev["body"]["tools"]
    assert chats[0]["body"]["messages"][0] == {"role": "system", "content": DEVELOPER}
    assert [t["function"]["name"] for t in chats[0]["body"]["tools"]] == [
        "exec_command",
        "agents__wait",
    ]
    second = chats[1]["body"]["messages"]
    assert second[3]["role"] == "assistant" and second[3]["tool_calls"][0]["id"] == call["call_id"]
    assert second[4] == {"role": "tool", "tool_call_id": call["call_id"], "content": "a b"}
    # the cache: each turn's hit covers the previous turn's prompt (its full blocks), and
    # the client read the upstream's figures as they are
    for prev, cur, resp in zip(records, records[1:], (r2, r3), strict=False):
        assert cur.cached_tokens % BLOCK == 0
        assert cur.cached_tokens >= (prev.prompt_tokens - 1) // BLOCK * BLOCK
        assert resp.usage.input_tokens_details.cached_tokens == cur.cached_tokens
        assert resp.usage.input_tokens == cur.prompt_tokens
    # (vLLM omits cached_tokens when nothing hit: the record says None, the client 0)
    assert r1.usage.input_tokens_details.cached_tokens == (records[0].cached_tokens or 0) == 0
    # the captured segments: the Responses items as received, the chat as sent; a growing
    # session changes nothing it sent before
    first, second_rec = records[0], records[1]
    names = [seg.name for seg in first.segments_in]
    assert names[:3] == ["tools", "exec_command", "agents"]
    assert names[4:] == ["input[0]:developer", "input[1]:user", "input[2]:user"]
    assert [seg.kind for seg in first.segments_in][4] == "system"
    assert first_changed(first.segments_in, second_rec.segments_in) is None
    assert first_changed(first.segments_out, second_rec.segments_out) is None
    assert [seg.name for seg in first.segments_out][:4] == [
        "tools",
        "exec_command",
        "agents__wait",
        "messages[0]:system",
    ]
    assert all(seg.hash in first.texts for seg in first.segments_in if seg.kind != "tools")


def test_non_streaming_turns_and_the_sdk_output_items_as_the_next_input():
    with stack() as s, s.client() as client:
        items: list = [_msg("developer", DEVELOPER), _msg("user", "hello")]
        r1 = client.responses.create(model="sim-model", input=items, tools=TOOLS)
        assert r1.status == "completed" and r1.output_text
        items += [i.model_dump(exclude_none=True) for i in r1.output]
        items.append(_msg("user", "more"))
        r2 = client.responses.create(model="sim-model", input=items, tools=TOOLS)
        records = s.records
    assert r2.usage.input_tokens_details.cached_tokens == records[1].cached_tokens > 0
    assert records[1].cached_tokens >= (records[0].prompt_tokens - 1) // BLOCK * BLOCK


@pytest.mark.parametrize("stream", [False, True])
def test_a_passthrough_channel_sends_responses_as_they_came(stream):
    """Gateway A passes Responses through (``responses_api: passthrough``) to gateway B,
    which serves ``/v1/responses`` in front of the simulated vLLM: A sends the body as it
    came (the model mapped), relays B's answer (the public name restored) and records
    B's usage."""
    with stack() as b:
        server, a_records, a_gateway = _gateway(
            {
                "base_url": b.url + "/v1",
                "responses_api": "passthrough",
                "model_map": {"public": "sim-model"},
            }
        )
        with server as a, openai.OpenAI(base_url=a.url + "/v1", api_key="k") as client:
            body = {"model": "public", "input": [_msg("user", "hello")], "tools": TOOLS}
            if stream:
                events = list(client.responses.create(stream=True, **body))
                assert events[0].type == "response.created"
                resp = events[-1].response
            else:
                resp = client.responses.create(**body)
            settled(a_gateway)
        b_rec = b.records[-1]
        sent = b.upstream.chats()[-1]["body"]
    assert resp.model == "public" and resp.output_text
    (a_rec,) = a_records.records
    assert (a_rec.endpoint, a_rec.status, a_rec.upstream_model) == ("responses", 200, "sim-model")
    assert (a_rec.prompt_tokens, a_rec.cached_tokens, a_rec.completion_tokens) == (
        b_rec.prompt_tokens,
        b_rec.cached_tokens or 0,  # vLLM omits a zero; a Responses answer says 0
        b_rec.completion_tokens,
    )
    assert resp.usage.input_tokens == b_rec.prompt_tokens
    # B received a Responses request (it converted it): the namespace was A's to keep
    assert [t["function"]["name"] for t in sent["tools"]] == ["exec_command", "agents__wait"]
    assert a_rec.segments_in == a_rec.segments_out


def _codex_capture(turn: int) -> tuple[dict, dict]:
    """A request the real Codex CLI sent (``tests/fixtures/codex/``): headers and body."""
    path = FIXTURE_ROOT / "codex" / f"0{turn}_v0.171.0_exec_turn{turn}.json"
    capture = json.loads(path.read_text())
    skip = {"host", "content-length", "authorization", "accept-encoding"}
    headers = {k: v for k, v in capture["headers"].items() if k not in skip}
    return headers, capture["body"]


def test_the_captured_codex_turns_keep_their_prefix_byte_for_byte_and_hit():
    """The two requests of a real ``codex exec`` conversation, as the CLI sent them: the
    upstream gets turn 1's bytes at the head of turn 2's, turn 2 hits all of turn 1's full
    blocks, and the Codex session names both records."""
    with stack() as s, httpx.Client(base_url=s.url, timeout=60) as http:
        for turn in (1, 2):
            headers, body = _codex_capture(turn)
            with http.stream("POST", "/v1/responses", headers=headers, json=body) as resp:
                assert resp.status_code == 200, resp.read()
                events = [line for line in resp.iter_lines() if line.startswith("event: ")]
            assert events[0] == "event: response.created"
            assert events[-1] == "event: response.completed"
        one, two = s.records
    raw1, raw2 = (e["raw"] for e in s.upstream.chats())  # complete once the servers are down
    head = raw1[: raw1.index(b',"tools":')]
    assert raw2.startswith(head[: head.rindex(b"]")])  # turn 1's messages, byte for byte
    assert two.cached_tokens >= (one.prompt_tokens - 1) // BLOCK * BLOCK
    session = body["prompt_cache_key"]
    assert one.session_id == two.session_id == session
    assert session.encode() not in raw1 + raw2
