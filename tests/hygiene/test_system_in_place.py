"""Later system messages delivered inside the client's turns: what changes, what does
not, and that an earlier turn's delivery never changes when the conversation grows.
Through the real gateway: the official Anthropic SDK, the upstream's body recorded."""

from __future__ import annotations

import anthropic
import msgspec
import openai
import pytest

from prefixgate.config import parse_config
from prefixgate.hygiene.system_in_place import (
    system_in_place,
    system_in_place_chat,
    system_in_place_typed,
)
from prefixgate.lab.upstream_sim import SimSettings, create_upstream_app
from prefixgate.protocol.messages_body import typed_request
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from tests.fakes import RecordingUpstream

REMINDER = "<total_tokens>180000 tokens left</total_tokens>"


def conversation(turns: int) -> list[dict]:
    out: list[dict] = []
    for t in range(turns):
        if t:
            out.append({"role": "assistant", "content": f"answer {t}"})
        out.append({"role": "user", "content": f"question {t}"})
        out.append({"role": "system", "content": REMINDER.replace("180000", str(180000 - t))})
    return out


def test_each_later_system_message_joins_the_turn_it_follows_marked():
    body = {
        "system": "top",
        "messages": [
            {"role": "system", "content": "leading: kept"},
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "note one"},
            {"role": "system", "content": [{"type": "text", "text": "note two"}]},
            {"role": "assistant", "content": "ok"},
            {"role": "system", "content": "after the answer"},
            {"role": "system", "content": ""},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}],
            },
            {"role": "system", "content": "after a tool result"},
        ],
    }
    out, changed = system_in_place(body)
    assert changed and body["messages"][2]["role"] == "system"  # the input is untouched
    assert out["messages"] == [
        {"role": "system", "content": "leading: kept"},
        {
            "role": "user",
            "content": "hi\n\n<system>\nnote one\n</system>\n\n<system>\nnote two\n</system>",
        },
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "<system>\nafter the answer\n</system>"},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": "x"},
                {"type": "text", "text": "<system>\nafter a tool result\n</system>"},
            ],
        },
    ]
    assert system_in_place({"messages": [{"role": "user", "content": "x"}]})[1] is False


@pytest.mark.parametrize("turns", [1, 2, 3, 4])
def test_the_typed_and_plain_forms_agree_and_earlier_turns_never_change(turns):
    def both(messages):
        body = {"model": "m", "max_tokens": 1, "messages": messages}
        plain, _ = system_in_place(body)
        typed, _ = system_in_place_typed(typed_request(body))
        assert msgspec.json.decode(msgspec.json.encode(typed.messages)) == plain["messages"]
        return plain["messages"]

    now, before = both(conversation(turns)), both(conversation(turns - 1))
    assert now[: len(before)] == before  # the conversation only grows


def test_a_turn_gets_the_very_messages_made_for_the_turn_before():
    """An agent's next request re-sends its earlier messages as the same structs (the
    decode lends them): the messages made of them are the previous turn's very objects,
    so the conversion, the encode and the capture after this step lend them in turn. A
    message made of other structs (an edit) is made anew, as it would be alone."""
    from prefixgate.apis.messages.request import SessionTurns
    from prefixgate.config import Limits
    from prefixgate.protocol.messages_body import decode_messages_body

    turns = SessionTurns(1 << 24)
    bodies = [
        msgspec.json.encode({"model": "m", "max_tokens": 1, "messages": conversation(t)})
        for t in (3, 4)
    ]
    out = []
    for raw in bodies:
        typed = decode_messages_body(raw, Limits(), turns, lambda _small: "s").typed
        out.append(system_in_place_typed(typed)[0].messages)
    before, now = out
    assert len(now) == len(before) + 2
    assert all(a is b for a, b in zip(before, now, strict=False))  # the very objects
    alone = system_in_place_typed(typed_request(msgspec.json.decode(bodies[1])))[0].messages
    assert now == alone  # equal to what the request gets alone
    edited = msgspec.json.decode(bodies[1])
    edited["messages"][0]["content"] = "question 0, edited"
    typed = decode_messages_body(msgspec.json.encode(edited), Limits(), turns, lambda _: "s")
    again = system_in_place_typed(typed.typed)[0].messages
    assert again[0] is not now[0] and "question 0, edited" in again[0].content
    assert again[1:] == now[1:]


def _gateway(tmp_path, template: str, **channel):
    sim = RecordingUpstream(create_upstream_app(SimSettings(chat_template=template)))
    up = ServerThread(sim)
    up.__enter__()
    ch = {"name": "e", "base_url": up.url + "/v1", **channel}
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = {"channels": [ch], "store": {"dsn": f"sqlite:///{tmp_path}/s.db"}}
    # no load shedding: on a busy shared machine a refused request tests nothing here
    cfg["server"] = {"shed_loop_lag": None}
    return sim, up, ServerThread(create_app(parse_config(cfg)))


@pytest.mark.parametrize(
    ("template", "channel", "moved"),
    [
        ("hoisting", {}, True),  # on by default where the template hoists
        ("hoisting", {"system_in_place": False}, False),
        ("in_place", {}, False),  # a template that keeps them: no change in bytes
        ("in_place", {"system_in_place": True}, True),
    ],
)
def test_through_the_gateway(tmp_path, template, channel, moved):
    sim, up, gw = _gateway(tmp_path, template, **channel)
    try:
        with gw:
            client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
            client.messages.create(model="m", max_tokens=8, messages=conversation(2))
            counted = client.messages.count_tokens(model="m", messages=conversation(2))
    finally:
        up.__exit__(None, None, None)
    [sent] = sim.chats()
    roles = [m["role"] for m in sent["body"]["messages"]]
    assert ("system" in roles) is not moved
    text = str(sent["body"]["messages"])
    assert ("<system>" in text) is moved and REMINDER.replace("180000", "179999") in text
    assert counted.input_tokens > 0


def test_a_template_that_keeps_them_in_place_gets_the_same_bytes(tmp_path):
    sent = []
    for setting in ({}, {"system_in_place": False}):
        sim, up, gw = _gateway(tmp_path / str(len(sent)), "in_place", **setting)
        try:
            with gw:
                client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
                client.messages.create(model="m", max_tokens=8, messages=conversation(3))
        finally:
            up.__exit__(None, None, None)
        [chat] = sim.chats()
        sent.append(chat["raw"])
    assert sent[0] == sent[1]


# -- the Chat and Responses paths: later system and developer messages ------------------


def chat_conversation(turns: int) -> list[dict]:
    """A Chat conversation with a leading system and developer message, then per turn a
    user question followed by a developer (odd turns) or system note, and a tool loop."""
    out: list[dict] = [
        {"role": "system", "content": "top"},
        {"role": "developer", "content": "leading developer: kept"},
    ]
    for t in range(turns):
        if t:
            call = {"id": f"c{t}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            out.append({"role": "tool", "tool_call_id": f"c{t}", "content": f"result {t}"})
            out.append({"role": "system", "content": f"after tool result {t}"})
            out.append({"role": "assistant", "content": f"answer {t}"})
        out.append({"role": "user", "content": [{"type": "text", "text": f"question {t}"}]})
        role = "developer" if t % 2 else "system"
        out.append({"role": role, "content": REMINDER.replace("180000", str(180000 - t))})
    return out


def test_a_chat_conversations_later_system_and_developer_messages_join_their_turns():
    out, changed = system_in_place_chat(chat_conversation(2))
    assert changed
    assert out == [
        {"role": "system", "content": "top"},
        {"role": "developer", "content": "leading developer: kept"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "question 0"},
                {"type": "text", "text": "<system>\n" + REMINDER + "\n</system>"},
            ],
        },
        chat_conversation(2)[4],  # the assistant's call and the tool result, as they came
        chat_conversation(2)[5],
        {"role": "user", "content": "<system>\nafter tool result 1\n</system>"},
        {"role": "assistant", "content": "answer 1"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "question 1"},
                {
                    "type": "text",
                    "text": "<system>\n" + REMINDER.replace("180000", "179999") + "\n</system>",
                },
            ],
        },
    ]
    for turns in (2, 3, 4):  # an earlier turn's delivery never changes as the conversation grows
        now, before = (system_in_place_chat(chat_conversation(n))[0] for n in (turns, turns - 1))
        assert now[: len(before)] == before
    assert system_in_place_chat([{"role": "user", "content": "x"}]) == (
        [{"role": "user", "content": "x"}],
        False,
    )


def _responses_input(turns: int) -> list[dict]:
    out: list[dict] = [{"role": "developer", "content": "leading developer: kept"}]
    for t in range(turns):
        if t:
            out.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"answer {t}"}],
                }
            )
        out.append({"role": "user", "content": f"question {t}"})
        out.append({"role": "developer", "content": REMINDER.replace("180000", str(180000 - t))})
    return out


def _chat_and_responses(tmp_path, template: str, turns: int, **channel) -> list[bytes]:
    """The upstream bodies for one Chat and one Responses request (official SDK)."""
    sim, up, gw = _gateway(tmp_path, template, **channel)
    try:
        with gw:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
            client.chat.completions.create(
                model="m", max_tokens=8, messages=chat_conversation(turns)
            )
            client.responses.create(model="m", max_output_tokens=8, input=_responses_input(turns))
    finally:
        up.__exit__(None, None, None)
    return [c["raw"] for c in sim.chats()]


@pytest.mark.parametrize(
    ("template", "channel", "moved"),
    [
        ("hoisting", {}, True),  # on by default where the template hoists
        ("hoisting", {"system_in_place": False}, False),
        ("in_place", {"system_in_place": True}, True),
    ],
)
def test_chat_and_responses_through_the_gateway(tmp_path, template, channel, moved):
    chat, responses = _chat_and_responses(tmp_path, template, 2, **channel)
    for raw in (chat, responses):
        messages = msgspec.json.decode(raw)["messages"]
        roles = [m["role"] for m in messages]
        later = [r for r in roles[roles.index("user") :] if r in ("system", "developer")]
        assert bool(later) is not moved, roles
        assert (b"<system>\\n<total_tokens>179999" in raw) is moved
        assert b"179999 tokens left" in raw  # what the model is told is there either way
    # the protected conversation only grows: turn 2's body holds turn 1's messages as sent
    if moved:
        one = _chat_and_responses(tmp_path / "one", template, 1, **channel)
        for earlier, later_raw in zip(one, (chat, responses), strict=True):
            head = msgspec.json.decode(earlier)["messages"]
            assert msgspec.json.decode(later_raw)["messages"][: len(head) - 1] == head[:-1]


def test_an_in_place_template_gets_chat_and_responses_bodies_byte_for_byte(tmp_path):
    on = _chat_and_responses(tmp_path / "on", "in_place", 3)
    off = _chat_and_responses(tmp_path / "off", "in_place", 3, system_in_place=False)
    assert on == off
    assert all(b'"role":"developer"' in raw or b'"role":"system"' in raw for raw in on)
