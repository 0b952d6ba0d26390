"""A chat request's segments in the order and form the engine's template renders them."""

from __future__ import annotations

from prefixgate.engine.rendering import Rendering
from prefixgate.record.rendered import rendered_segments
from prefixgate.record.segments import first_changed, segments_openai

TOOLS = [{"type": "function", "function": {"name": "Read", "parameters": {}}}]
HOISTS = Rendering("system_first", "hoisted", "dropped", "test")
QWEN = Rendering("tools_first", "in_place", "until_next_user", "test")
IN_PLACE = Rendering("tools_first", "in_place", "kept", "test")


def turns(n: int) -> list[dict]:
    out = [{"role": "system", "content": "top"}]
    for t in range(n):
        if t:
            out.append({"role": "assistant", "content": f"a{t}", "reasoning_content": f"r{t}"})
        out += [
            {"role": "user", "content": f"u{t}"},
            {"role": "system", "content": f"<total_tokens>{100 - t}</total_tokens>"},
        ]
    return out


def names(segs) -> list[str]:
    return [s.name for s in segs]


def test_later_system_messages_move_into_the_system_prompt():
    msgs = turns(2)
    segs = segments_openai({"messages": msgs, "tools": TOOLS}, tools_first=False)
    got = rendered_segments(segs, HOISTS, msgs)
    assert names(got) == [
        "messages[0]:system",
        "messages[2]:system@head",
        "messages[5]:system@head",
        "tools",
        "Read",
        "messages[1]:user",
        "messages[3]:assistant",
        "messages[4]:user",
    ]
    assert {s.kind for s in got[:3]} == {"system"}
    # turn 3 against turn 2: the change is the new reminder, at the head
    m3 = turns(3)
    seg3 = rendered_segments(
        segments_openai({"messages": m3, "tools": TOOLS}, tools_first=False), HOISTS, m3
    )
    fc = first_changed(got, seg3)
    assert fc is not None and seg3[fc.index].name == "messages[8]:system@head"
    # in place: the same list, and turn 3 only grows
    plain = rendered_segments(segs, IN_PLACE, msgs)
    assert plain is segs


def test_past_reasoning_not_rendered_once_a_user_turn_follows():
    loop = turns(2)[:-2]  # ... the assistant's turn with reasoning, no user after it yet
    loop.append({"role": "tool", "tool_call_id": "c", "content": "out"})
    seg_loop = rendered_segments(segments_openai({"messages": loop}), QWEN, loop)
    assert "messages[3]:assistant" in names(seg_loop)
    grown = [*loop, {"role": "user", "content": "next"}]
    seg_grown = rendered_segments(segments_openai({"messages": grown}), QWEN, grown)
    fc = first_changed(seg_loop, seg_grown)
    assert fc is not None and seg_grown[fc.index].name == "messages[3]:assistant/no-reasoning"
    assert seg_grown[fc.index].tokens < seg_loop[fc.index].tokens
