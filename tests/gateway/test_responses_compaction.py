"""Compaction on ``/v1/responses`` in front of the simulated vLLM, through the ``openai``
SDK's own types: a ``compaction_trigger`` answered with one ``compaction`` item (streamed
and not), that item accepted in the next request and sent upstream as its summary, an item
the gateway did not make refused, and the turn after a compaction named for what it is
(``context_compacted``) by the diagnostics."""

from __future__ import annotations

import openai
import pytest
from openai.types.responses import CompactedResponse, Response, ResponseCompactionItem

from prefixgate.apis.responses.compaction import SUMMARY_HEAD, SUMMARY_REQUEST, unseal
from tests.gateway.test_responses_sim import DEVELOPER, TOOLS, _msg, _stream, stack

TRIGGER = {"type": "compaction_trigger"}


def _history() -> list[dict]:
    return [
        _msg("developer", DEVELOPER),
        _msg("user", "read the notes and reply OK: " + "alpha beta " * 200),
        _msg("assistant", "OK"),
    ]


def _compaction(done: list[dict]) -> dict:
    assert [i["type"] for i in done] == ["compaction"], done
    return ResponseCompactionItem.model_validate(done[0]).model_dump(exclude_none=True)


@pytest.mark.parametrize("streamed", [True, False])
def test_a_trigger_is_answered_with_one_compaction_item_of_the_engines_summary(streamed):
    with stack() as s, s.client() as client:
        items = [*_history(), TRIGGER]
        if streamed:
            done, final = _stream(client, items, prompt_cache_key="c1")
        else:
            final = client.responses.create(
                model="sim-model", input=items, tools=TOOLS, store=False, prompt_cache_key="c1"
            )
            assert isinstance(final, Response) and final.status == "completed"
            done = [i.model_dump(exclude_none=True) for i in final.output]
        item = _compaction(done)
    (chat,) = s.upstream.chats()  # complete once the servers stopped
    sent = chat["body"]
    # the engine was asked for a summary: the conversation as it was, tools and all (its
    # prefix cached), then the request, in text only
    assert sent["messages"][-1] == {"role": "user", "content": SUMMARY_REQUEST}
    assert sent["messages"][:-1][-1] == {"role": "assistant", "content": "OK"}
    assert sent["tools"] and sent["tool_choice"] == "none"
    assert final.usage.input_tokens > 0
    # the item holds what the engine wrote (the simulated engine's text: words)
    summary = unseal(item["encrypted_content"])
    assert summary and summary.split()


def test_the_next_turn_sends_the_summary_upstream_and_is_a_compacted_context():
    with stack() as s, s.client() as client:
        head = _history()
        ask = {"prompt_cache_options": {"comparison_response_id": None}}  # keep it to compare
        _, first = _stream(client, head, prompt_cache_key="c2", extra_body=ask)
        done, _ = _stream(client, [*head, TRIGGER], prompt_cache_key="c2")
        item = _compaction(done)
        after = [head[0], head[1], item, _msg("user", "go on")]
        _, final = _stream(
            client,
            after,
            prompt_cache_key="c2",
            extra_body={"prompt_cache_options": {"comparison_response_id": first.id}},
        )
    chats = s.upstream.chats()
    messages = chats[-1]["body"]["messages"]
    assert messages[-2] == {
        "role": "user",
        "content": SUMMARY_HEAD + unseal(item["encrypted_content"]),
    }
    assert messages[-1] == {"role": "user", "content": "go on"}
    # compared with the turn before the compaction: the compacted context, where it began
    diag = final.prompt_cache_diagnostics
    assert diag.type == "cache_miss" and diag.reason == "context_compacted", diag
    changed = final.model_extra["prefixgate_diagnostics"]["changed"]
    assert changed["segment"] == "input[2]:compaction"


def test_a_compaction_item_the_gateway_did_not_make_is_refused():
    with stack() as s, s.client() as client:
        items = [
            *_history(),
            {"type": "compaction", "encrypted_content": "gAAAAABvendor-sealed"},
            _msg("user", "go on"),
        ]
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="sim-model", input=items, store=False)
        assert not s.upstream.chats()
    body = err.value.body
    assert body["param"] == "input[3].encrypted_content"
    assert "not a compaction this gateway made" in body["message"]


def test_a_trigger_anywhere_but_last_is_refused():
    with stack() as s, s.client() as client:
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="sim-model", input=[TRIGGER, *_history()], store=False)
        assert not s.upstream.chats()
    assert err.value.body["param"] == "input[0].type"


def test_the_compact_endpoint_answers_in_the_vendors_shape():
    """``client.responses.compact``: the user messages as they came, then one compaction
    item; the engine was asked for the summary; the item is accepted in the next turn."""
    with stack() as s, s.client() as client:
        history = _history()
        compacted = client.responses.compact(model="sim-model", input=history)
        assert isinstance(compacted, CompactedResponse)
        assert compacted.object == "response.compaction" and compacted.usage.input_tokens > 0
        # the SDK types output messages as the model's (output_text): a user message's
        # input_text parts are kept as they came, which its serializer warns about
        output = [i.model_dump(exclude_none=True, warnings=False) for i in compacted.output]
        _, final = _stream(client, [*output, _msg("user", "go on")])
        recs = s.records
    chats = s.upstream.chats()
    assert [i["type"] for i in output] == ["message", "compaction"]
    assert output[0]["role"] == "user" and output[0]["content"] == history[1]["content"]
    assert chats[0]["body"]["messages"][-1] == {"role": "user", "content": SUMMARY_REQUEST}
    assert "stream" not in chats[0]["body"]
    assert chats[1]["body"]["messages"][-2]["content"].startswith(SUMMARY_HEAD)
    assert final.status == "completed"
    assert [(r.endpoint, r.status) for r in recs] == [("responses", 200)] * 2


def test_a_summary_turn_of_the_clients_own_is_a_compacted_context_too():
    """Codex's own compaction (any provider but OpenAI's or Azure's): the user messages
    kept, the answers replaced by a summary in a user message; no compaction item."""
    with stack() as s, s.client() as client:
        ask = {"prompt_cache_options": {"comparison_response_id": None}}
        notes = [_msg("user", f"notes {n}: " + "gamma " * 200) for n in (2, 3)]
        before = [*_history(), notes[0], _msg("assistant", "OK"), notes[1]]
        _, first = _stream(client, before, prompt_cache_key="c3", extra_body=ask)
        summary = _msg("user", "Summary: read three times.")
        after = [*_history()[:2], *notes, summary, _msg("user", "go")]
        _, final = _stream(
            client,
            after,
            prompt_cache_key="c3",
            extra_body={"prompt_cache_options": {"comparison_response_id": first.id}},
        )
    assert final.prompt_cache_diagnostics.reason == "context_compacted"
