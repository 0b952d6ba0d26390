"""Anthropic's ``diagnostics`` on ``/v1/messages``, through the official SDK's own types:
each reason from a real change between two turns (plain and streamed), no divergence when
the turn only appends, not found for an unknown id and for another owner's id, and the
request sent upstream untouched by the field."""

from __future__ import annotations

import anthropic
import pytest
from anthropic.types import (
    CacheMissMessagesChanged,
    CacheMissModelChanged,
    CacheMissPreviousMessageNotFound,
    CacheMissSystemChanged,
    CacheMissToolsChanged,
    CacheMissUnavailable,
    Message,
)

from prefixgate.diagnostics.verdict import EXTENSION
from tests.diagnostics import keys

SYSTEM = [{"type": "text", "text": "You are a careful coding agent. " * 40}]
TOOLS = [
    {
        "name": n,
        "description": f"The {n} tool. " * 20,
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    for n in ("read", "write", "grep")
]
FIRST = [{"role": "user", "content": "Fix the failing test in parser.py, please. " * 30}]


def _client(gw, key: str = "k") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)


def _ask(client, previous, *, stream=False, **kw) -> Message:
    body = {
        "model": "m",
        "max_tokens": 32,
        "system": SYSTEM,
        "tools": TOOLS,
        "messages": FIRST,
        "diagnostics": {"previous_message_id": previous},
        **kw,
    }
    if not stream:
        return client.messages.create(**body)
    with client.messages.stream(**body) as s:
        return s.get_final_message()


def _next_turn(msg: Message) -> list[dict]:
    return [
        *FIRST,
        {"role": "assistant", "content": [{"type": "text", "text": msg.content[0].text}]},
        {"role": "user", "content": "Now run the tests."},
    ]


@pytest.fixture(params=["plain", "stream"])
def stream(request) -> bool:
    return request.param == "stream"


def test_a_turn_that_only_appends_has_no_divergence(gateway, stream):
    gw = gateway()
    client = _client(gw)
    first = _ask(client, None, stream=stream)
    assert first.diagnostics is None  # opted in, nothing to compare
    assert first.id.startswith("msg_")
    second = _ask(client, first.id, stream=stream, messages=_next_turn(first))
    assert second.diagnostics is None
    ext = getattr(second, EXTENSION)
    assert ext["answer"] == "none" and ext["found_in"] == "memory"
    # never forwarded upstream, and the prompt is the same with or without the field
    sent = gw.upstream.requests
    assert all("diagnostics" not in body for body in sent)
    plain = client.messages.create(
        model="m", max_tokens=32, system=SYSTEM, tools=TOOLS, messages=_next_turn(first)
    )
    assert plain.diagnostics is None and not hasattr(plain, EXTENSION)
    assert sent[-1]["messages"] == sent[-2]["messages"]
    assert sent[-1]["tools"] == sent[-2]["tools"]


@pytest.mark.parametrize(
    ("change", "kind", "part"),
    [
        ({"model": "other"}, CacheMissModelChanged, None),
        (
            {"system": [SYSTEM[0], {"type": "text", "text": "Today is 2026-12-01 20:31."}]},
            CacheMissSystemChanged,
            "system",
        ),
        ({"tools": list(reversed(TOOLS))}, CacheMissToolsChanged, "tools"),
        ({"tools": TOOLS[:2]}, CacheMissToolsChanged, "tools"),
    ],
    ids=["model", "system", "tools-reordered", "tools-removed"],
)
def test_each_structural_change_is_named(gateway, stream, change, kind, part):
    gw = gateway()
    client = _client(gw)
    first = _ask(client, None, stream=stream)
    body = {"messages": _next_turn(first), **change}
    second = _ask(client, first.id, stream=stream, **body)
    reason = second.diagnostics.cache_miss_reason
    assert isinstance(reason, kind)
    # about the whole earlier prompt (100 tokens upstream) or what followed the change
    assert 0 < reason.cache_missed_input_tokens <= 100
    ext = getattr(second, EXTENSION)
    assert ext["answer"] == reason.type
    if part is not None:
        assert ext["changed"]["part"] == part
        assert ext["fix"]


def test_an_edited_earlier_message_is_messages_changed(gateway, stream):
    gw = gateway()
    client = _client(gw)
    first = _ask(client, None, stream=stream)
    edited = _next_turn(first)
    edited[0] = {"role": "user", "content": "Fix the failing test in lexer.py, please."}
    second = _ask(client, first.id, stream=stream, messages=edited)
    reason = second.diagnostics.cache_miss_reason
    assert isinstance(reason, CacheMissMessagesChanged)
    # the tools and system before it matched: only the first message's tokens were missed
    assert 0 < reason.cache_missed_input_tokens < 50
    ext = getattr(second, EXTENSION)
    assert ext["changed"]["segment"] == "messages[0]:user"
    assert ext["changed"]["upstream_segment"].startswith("messages[")


def test_other_prompt_affecting_parameters_are_unavailable(gateway, stream):
    gw = gateway()
    client = _client(gw)
    first = _ask(client, None, stream=stream)
    second = _ask(
        client, first.id, stream=stream, messages=_next_turn(first), tool_choice={"type": "any"}
    )
    assert isinstance(second.diagnostics.cache_miss_reason, CacheMissUnavailable)


def test_an_unknown_id_is_not_found(gateway, stream):
    gw = gateway()
    client = _client(gw)
    for unknown in ("msg_" + "0" * 32, "msg_01XFDUDYJgAACzvnptvVoYEL"):
        answer = _ask(client, unknown, stream=stream)
        assert isinstance(answer.diagnostics.cache_miss_reason, CacheMissPreviousMessageNotFound)


def test_another_owners_id_is_not_found_and_says_nothing_of_it(gateway, stream):
    gw = gateway(keys=keys())
    first = _ask(_client(gw, "key-alice"), None, stream=stream)
    # the same owner's other key may name it ...
    mine = _ask(_client(gw, "key-alice-2"), first.id, stream=stream, model="other")
    assert isinstance(mine.diagnostics.cache_miss_reason, CacheMissModelChanged)
    # ... another owner gets exactly what an unknown id gets
    theirs = _ask(_client(gw, "key-bob"), first.id, stream=stream, model="other")
    assert isinstance(theirs.diagnostics.cache_miss_reason, CacheMissPreviousMessageNotFound)
    ext = {k: v for k, v in getattr(theirs, EXTENSION).items() if k != "engine"}
    assert ext == {"compared_with": first.id, "answer": "not_found", "found_in": None}


def test_a_malformed_field_is_the_clients_error(gateway):
    gw = gateway()
    client = _client(gw)
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.messages.create(
            model="m",
            max_tokens=8,
            messages=FIRST,
            diagnostics={"previous_message_id": 7},  # type: ignore[typeddict-item]
        )
    assert exc.value.status_code == 400
    assert "diagnostics.previous_message_id" in str(exc.value)
    assert not gw.upstream.requests


def test_the_stream_says_the_structure_first_and_the_engine_at_the_end(gateway):
    gw = gateway()
    client = _client(gw)
    first = _ask(client, None)
    events = list(
        client.messages.create(
            model="m",
            max_tokens=32,
            system=SYSTEM[:0] + [{"type": "text", "text": "Another agent."}],
            tools=TOOLS,
            messages=_next_turn(first),
            diagnostics={"previous_message_id": first.id},
            stream=True,
        )
    )
    start, delta = events[0], next(e for e in events if e.type == "message_delta")
    assert start.type == "message_start"
    reason = start.message.diagnostics.cache_miss_reason
    assert isinstance(reason, CacheMissSystemChanged)
    head = getattr(start.message, EXTENSION)
    assert head["changed"]["segment"] == "system[0]" and "engine" not in head
    tail = getattr(delta, EXTENSION)
    assert tail["engine"] == {"prompt_tokens": 100, "cached_tokens": 0, "missed_tokens": 100}
    assert tail["answer"] == "system_changed"


def test_the_beta_surface_with_its_header_gets_the_same_answer(gateway):
    gw = gateway()
    client = _client(gw)
    body = {"model": "m", "max_tokens": 16, "system": SYSTEM, "messages": FIRST}
    first = client.beta.messages.create(
        **body, diagnostics={"previous_message_id": None}, betas=["cache-diagnosis-2026-04-07"]
    )
    second = client.beta.messages.create(
        **{**body, "model": "other"},
        diagnostics={"previous_message_id": first.id},
        betas=["cache-diagnosis-2026-04-07"],
    )
    assert first.diagnostics is None
    assert second.diagnostics.cache_miss_reason.type == "model_changed"
    assert gw.upstream.headers[-1].get("anthropic-beta") is None  # an openai channel


def test_an_anthropic_channel_is_not_sent_the_field(gateway, upstream):
    # the upstream speaks Anthropic's protocol and answers with its own ids: the field is
    # neither forwarded nor answered here
    gw = gateway(channel={"kind": "anthropic", "base_url": upstream.url.removesuffix("/v1")})
    msg = _ask(_client(gw), None)
    assert msg.diagnostics is None and not hasattr(msg, EXTENSION)
    assert upstream.requests and "diagnostics" not in upstream.requests[-1]
