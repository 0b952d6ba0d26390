"""The ``prefix`` policy's estimate in the order the upstream's template renders the
prompt: hoisted later system messages at the head, past reasoning dropped where the
template drops it; the same blocks as before for a template that changes nothing."""

from __future__ import annotations

from prefixgate.engine.rendering import Rendering
from prefixgate.routing.prefix import engine_messages, prompt_blocks

HOISTING = Rendering("system_first", "hoisted", "dropped", "tokenize")
IN_PLACE = Rendering("tools_first", "in_place", "kept", "tokenize")
LAST_QUERY = Rendering("tools_first", "in_place", "until_next_user", "tokenize")


def turns(n: int) -> list[dict]:
    out: list[dict] = [{"role": "system", "content": "You are a careful assistant. " * 40}]
    for t in range(n):
        if t:
            out.append({"role": "assistant", "content": f"answer {t} " * 30})
        out.append({"role": "user", "content": f"question {t} " * 30})
        out.append({"role": "system", "content": f"<total_tokens>{180000 - t} left</total_tokens>"})
    return out


def leading(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a.hashes[n] == b.hashes[n]:
        n += 1
    return n


def test_a_hoisting_template_is_estimated_with_the_new_system_message_at_the_head():
    one, two = ({"messages": turns(n)} for n in (1, 2))
    moved = engine_messages(two["messages"], HOISTING)
    assert [m["role"] for m in moved] == ["system", "system", "system", "user", "assistant", "user"]
    # in the engine's order turn 2 shares no more than the system prompt with turn 1 ...
    hoisted = [prompt_blocks(r, 16, rendering=HOISTING) for r in (one, two)]
    head = prompt_blocks({"messages": turns(0)}, 16, rendering=HOISTING)  # the system prompt
    assert leading(*hoisted) <= len(head) + 1 < len(hoisted[0]) - 3
    # ... where the request's order (an in-place template) shares all of turn 1's
    kept = [prompt_blocks(r, 16, rendering=IN_PLACE) for r in (one, two)]
    assert leading(*kept) >= len(kept[0]) - 1
    # an in-place rendering is the estimate as it was (the request's order)
    assert kept[1] == prompt_blocks(two, 16, "tools_first")
    assert engine_messages(two["messages"], IN_PLACE) is two["messages"]


def test_past_reasoning_is_left_out_where_the_template_drops_it():
    loop = [
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "", "reasoning_content": "think " * 200},
        {"role": "user", "content": "now test it"},
        {"role": "assistant", "content": "", "reasoning_content": "current thought"},
    ]
    got = engine_messages(loop, LAST_QUERY)
    assert (
        "reasoning_content" not in got[1] and got[3] == loop[3] and "reasoning_content" in loop[1]
    )
    with_it = prompt_blocks({"messages": loop}, 16, rendering=IN_PLACE)
    without = prompt_blocks({"messages": loop}, 16, rendering=LAST_QUERY)
    assert len(without) < len(with_it)  # 200 words of past reasoning the engine never sees


def test_a_configured_render_order_places_the_tools():
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
    req = {"messages": turns(1), "tools": tools}
    first = prompt_blocks(req, 16, rendering=HOISTING)
    assert first == prompt_blocks(
        {**req, "messages": engine_messages(req["messages"], HOISTING)}, 16, "system_first"
    )
    assert first != prompt_blocks(req, 16, rendering=IN_PLACE)
