"""OpenAI's ``prompt_cache_diagnostics`` on ``/v1/responses``, through the official SDK's
own types: a hit when the turn only appends, each reason from a real change (model,
prompt_cache_key, tools, input, the output settings), not found for an unknown and for
another owner's id, ``prompt_cache_options`` echoed, and the extension at the start and
the end of a stream."""

from __future__ import annotations

import hashlib

import httpx
import openai
import pytest
from openai.types.responses.response import (
    PromptCacheDiagnosticsCacheHit,
    PromptCacheDiagnosticsCacheMiss,
    PromptCacheDiagnosticsComparisonResponseNotFound,
    Response,
)

from prefixgate.diagnostics.verdict import EXTENSION

INSTRUCTIONS = "You are a careful coding agent working in a repository. " * 40
TOOLS = [
    {
        "type": "function",
        "name": n,
        "description": f"The {n} tool. " * 20,
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    for n in ("read", "write", "grep")
]
FIRST = [{"role": "user", "content": "Fix the failing test in parser.py, please. " * 30}]


def _client(gw, key: str = "k") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)


def _ask(client, previous, *, stream=False, **kw) -> Response:
    body = {
        "model": "m",
        "instructions": INSTRUCTIONS,
        "tools": TOOLS,
        "input": FIRST,
        "prompt_cache_key": "conv-1",
        "prompt_cache_options": {"comparison_response_id": previous},
        **kw,
    }
    if not stream:
        return client.responses.create(**body)
    with client.responses.stream(**body) as s:
        return s.get_final_response()


def _next_turn(resp: Response) -> list[dict]:
    return [
        *FIRST,
        {"role": "assistant", "content": resp.output_text},
        {"role": "user", "content": "Now run the tests."},
    ]


@pytest.fixture(params=["plain", "stream"])
def stream(request) -> bool:
    return request.param == "stream"


def test_a_turn_that_only_appends_is_a_hit(gateway, stream):
    gw = gateway()
    client = _client(gw)
    first = _ask(client, None, stream=stream)
    assert first.id.startswith("resp_")
    assert first.prompt_cache_diagnostics is None  # nothing named to compare with
    assert first.prompt_cache_options.comparison_response_id is None
    second = _ask(client, first.id, stream=stream, input=_next_turn(first))
    assert isinstance(second.prompt_cache_diagnostics, PromptCacheDiagnosticsCacheHit)
    options = second.prompt_cache_options
    assert (options.comparison_response_id, options.mode, options.ttl) == (
        first.id,
        "implicit",
        "30m",
    )
    ext = getattr(second, EXTENSION)
    assert ext["answer"] == "none"
    assert ext["engine"] == {"prompt_tokens": 100, "cached_tokens": 0, "missed_tokens": 100}
    assert all("prompt_cache_options" not in body for body in gw.upstream.requests)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"model": "other"}, "model_changed"),
        ({"prompt_cache_key": "conv-2"}, "prompt_cache_key_changed"),
        ({"tools": TOOLS[1:]}, "tools_changed"),
        ({"instructions": "Today is 2026-12-01. " + INSTRUCTIONS}, "input_changed"),
        ({"text": {"format": {"type": "json_object"}}}, "text_format_changed"),
        ({"reasoning": {"effort": "high"}}, "reasoning_effort_changed"),
    ],
    ids=["model", "prompt_cache_key", "tools", "instructions", "text_format", "effort"],
)
def test_each_change_is_named(gateway, stream, change, reason):
    gw = gateway()
    client = _client(gw)
    first = _ask(client, None, stream=stream)
    second = _ask(client, first.id, stream=stream, **{"input": _next_turn(first), **change})
    diag = second.prompt_cache_diagnostics
    assert isinstance(diag, PromptCacheDiagnosticsCacheMiss)
    assert diag.reason == reason
    assert 0 < diag.cache_missed_tokens <= 100
    assert 0 <= diag.comparison_reusable_tokens < 100


def test_an_edited_earlier_item_is_input_changed_after_a_reusable_prefix(gateway, stream):
    gw = gateway()
    client = _client(gw)
    first = _ask(client, None, stream=stream)
    edited = _next_turn(first)
    edited[0] = {"role": "user", "content": "Fix the failing test in lexer.py, please."}
    second = _ask(client, first.id, stream=stream, input=edited)
    diag = second.prompt_cache_diagnostics
    assert diag.reason == "input_changed"
    # the tools and the instructions were reusable; the edited item and what follows not
    assert diag.comparison_reusable_tokens > diag.cache_missed_tokens > 0
    assert getattr(second, EXTENSION)["changed"]["segment"] == "input[0]:user"


def test_unknown_and_other_owners_ids_are_not_found(gateway, stream):
    keys = [
        {"name": n, "key_sha256": hashlib.sha256(k.encode()).hexdigest(), "owner": o}
        for n, k, o in (("a", "key-a", "team-a"), ("b", "key-b", "team-b"))
    ]
    gw = gateway(keys=keys)
    first = _ask(_client(gw, "key-a"), None, stream=stream)
    for client, previous in (
        (_client(gw, "key-a"), "resp_" + "f" * 32),
        (_client(gw, "key-a"), "resp_68af3c0f1b2c8190"),
        (_client(gw, "key-b"), first.id),
    ):
        answer = _ask(client, previous, stream=stream)
        assert isinstance(
            answer.prompt_cache_diagnostics, PromptCacheDiagnosticsComparisonResponseNotFound
        )


def test_not_asking_adds_nothing(gateway):
    gw = gateway()
    resp = _client(gw).responses.create(model="m", input="hi")
    assert resp.prompt_cache_diagnostics is None and resp.prompt_cache_options is None
    assert not hasattr(resp, EXTENSION)


def test_the_stream_says_the_structure_first_and_the_engine_at_the_end(gateway):
    gw = gateway()
    client = _client(gw)
    first = _ask(client, None)
    body = {
        "model": "m",
        "instructions": INSTRUCTIONS,
        "tools": TOOLS[1:],
        "input": _next_turn(first),
        "prompt_cache_key": "conv-1",
        "prompt_cache_options": {"comparison_response_id": first.id},
    }
    with client.responses.stream(**body) as s:
        events = list(s)
    created = events[0].response
    assert created.prompt_cache_diagnostics.reason == "tools_changed"
    assert "engine" not in getattr(created, EXTENSION)
    done = events[-1].response
    assert events[-1].type == "response.completed"
    assert getattr(done, EXTENSION)["engine"]["prompt_tokens"] == 100
    assert done.prompt_cache_diagnostics == created.prompt_cache_diagnostics


def test_a_malformed_option_is_the_clients_error(gateway):
    gw = gateway()
    with pytest.raises(openai.BadRequestError) as exc:
        _client(gw).responses.create(
            model="m", input="hi", prompt_cache_options={"comparison_response_id": 3}
        )
    assert exc.value.status_code == 400
    assert not gw.upstream.requests


def test_chat_completions_offer_the_extension_on_request(gateway):
    gw = gateway()
    client = _client(gw)
    messages = [{"role": "system", "content": INSTRUCTIONS}, *FIRST]
    first = client.chat.completions.with_raw_response.create(
        model="m", messages=messages, extra_headers={"x-prefixgate-diagnostics": "first"}
    )
    rid = first.headers["x-request-id"]
    assert getattr(first.parse(), EXTENSION)["answer"] == "none"
    changed = [{"role": "system", "content": "Today is Tuesday. " + INSTRUCTIONS}, *FIRST]
    stream = client.chat.completions.create(
        model="m",
        messages=changed,
        stream=True,
        extra_headers={"x-prefixgate-diagnostics": rid},
    )
    chunks = list(stream)
    ext = getattr(chunks[-1], EXTENSION)
    assert chunks[-1].choices == []
    assert ext["answer"] == "input_changed"
    assert ext["changed"]["segment"] == "messages[0]:system"
    assert ext["engine"]["prompt_tokens"] == 100
    # without the header, nothing is added
    plain = client.chat.completions.create(model="m", messages=changed)
    assert not hasattr(plain, EXTENSION)


def test_an_answer_is_looked_up_after_it_ended(gateway):
    keys = [
        {"name": n, "key_sha256": hashlib.sha256(k.encode()).hexdigest(), "owner": o}
        for n, k, o in (("a", "key-a", "team-a"), ("b", "key-b", "team-b"))
    ]
    gw = gateway(keys=keys)
    first = _ask(_client(gw, "key-a"), None)
    second = _ask(_client(gw, "key-a"), first.id, tools=TOOLS[1:])
    got = httpx.get(gw.url + f"/v1/diagnostics/{second.id}", headers={"x-api-key": "key-a"})
    assert got.status_code == 200
    body = got.json()
    assert body["diagnosis"]["answer"] == "tools_changed"
    assert body["diagnosis"]["previous"] == first.id.removeprefix("resp_")
    assert body["engine"]["prompt_tokens"] == 100
    theirs = httpx.get(gw.url + f"/v1/diagnostics/{second.id}", headers={"x-api-key": "key-b"})
    assert theirs.status_code == 404
    assert theirs.json()["error"]["type"] == "not_found_error"
