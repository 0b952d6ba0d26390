"""Later system messages delivered inside the client's turns: what changes, what does
not, and that an earlier turn's delivery never changes when the conversation grows.
Through the real gateway: the official Anthropic SDK, the upstream's body recorded."""

from __future__ import annotations

import anthropic
import msgspec
import pytest

from prefixgate.config import parse_config
from prefixgate.hygiene.system_in_place import system_in_place, system_in_place_typed
from prefixgate.protocol.messages_body import typed_request
from prefixgate.serve.app import build_app
from prefixgate.serve.process import ServerThread
from prefixgate.upstream_sim import SimSettings, create_upstream_app
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


def _gateway(tmp_path, template: str, **channel):
    sim = RecordingUpstream(create_upstream_app(SimSettings(chat_template=template)))
    up = ServerThread(sim)
    up.__enter__()
    ch = {"name": "e", "base_url": up.url + "/v1", **channel}
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = parse_config({"channels": [ch], "store": {"dsn": f"sqlite:///{tmp_path}/s.db"}})
    return sim, up, ServerThread(build_app(cfg))


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
