"""The comparison over recorded segments: the engine's order, and where a request stopped
extending the earlier one."""

from __future__ import annotations

from prefixgate.diagnostics.compare import diverge, engine_order, tokens
from prefixgate.record.record import Segment


def seg(kind: str, name: str, h: str, n: int = 10) -> Segment:
    return Segment(kind, name, h, n * 4, n)


SYSTEM = [seg("system", "system[0]", "s0", 100), seg("system", "system[1]", "s1", 20)]
TOOLS = [
    seg("tools", "tools", "T", 50),
    seg("tool", "read", "t1", 25),
    seg("tool", "grep", "t2", 25),
]
TURN = [seg("message", "messages[0]:user", "m0", 30)]


def test_engine_order_moves_the_tools_only_when_the_template_differs():
    received = SYSTEM + TOOLS + TURN
    assert engine_order(received, tools_first=False) is received  # nothing to do
    ordered = engine_order(received, tools_first=True)
    assert [s.name for s in ordered] == [
        "tools",
        "read",
        "grep",
        "system[0]",
        "system[1]",
        "messages[0]:user",
    ]
    assert engine_order(ordered, tools_first=False) == received


def test_a_turn_that_appends_does_not_diverge():
    prev = SYSTEM + TOOLS + TURN
    cur = prev + [
        seg("message", "messages[1]:assistant", "m1"),
        seg("message", "messages[2]:user", "m2"),
    ]
    assert diverge(prev, cur) is None
    assert diverge(prev, prev) is None


def test_the_first_changed_segment_and_the_tokens_around_it():
    prev = SYSTEM + TOOLS + TURN
    cur = [SYSTEM[0], seg("system", "system[1]", "other", 20), *TOOLS, *TURN]
    at = diverge(prev, cur)
    assert (at.part, at.segment, at.index) == ("system", "system[1]", 1)
    assert at.prefix_tokens == 100
    assert at.missed_tokens == 20 + 50 + 30  # the tool segments are parts of their list


def test_a_removed_section_entry_names_the_section_that_changed():
    prev = SYSTEM + TOOLS + TURN
    # the second system block removed: system meets tools where system was
    at = diverge(prev, [SYSTEM[0], *TOOLS, *TURN])
    assert (at.part, at.segment) == ("system", "system[1]")
    # every tool removed: the conversation meets where the tools were
    at = diverge(prev, SYSTEM + TURN)
    assert (at.part, at.segment) == ("tools", "tools")
    # a new system block: the tools meet a system block
    extra = seg("system", "system[2]", "s2", 5)
    at = diverge(prev, [*SYSTEM, extra, *TOOLS, *TURN])
    assert (at.part, at.segment) == ("system", "system[2]")


def test_a_reordered_tool_list_diverges_at_the_list():
    prev = SYSTEM + TOOLS + TURN
    swapped = [seg("tools", "tools", "T'", 50), TOOLS[2], TOOLS[1]]
    at = diverge(prev, SYSTEM + swapped + TURN)
    assert (at.part, at.segment) == ("tools", "tools")


def test_a_shorter_request_dropped_the_tail():
    prev = SYSTEM + TOOLS + TURN + [seg("message", "messages[1]:assistant", "m1")]
    at = diverge(prev, SYSTEM + TOOLS + TURN)
    assert (at.part, at.segment, at.missed_tokens) == ("messages", None, 0)
    assert at.prefix_tokens == tokens(SYSTEM + TOOLS + TURN) == 200


def test_a_template_that_hoists_puts_later_system_messages_in_the_system_prompt():
    talk = [
        *TURN,
        seg("message", "messages[1]:assistant", "m1"),
        seg("message", "messages[2]:system", "r1", 5),
        seg("message", "messages[3]:user", "m3"),
    ]
    received = SYSTEM + TOOLS + talk
    assert engine_order(received, tools_first=False) is received  # in place: nothing to do
    names = [s.name for s in engine_order(received, tools_first=False, hoists_system=True)]
    assert names == [
        "system[0]",
        "system[1]",
        "messages[2]:system@head",
        "tools",
        "read",
        "grep",
        "messages[0]:user",
        "messages[1]:assistant",
        "messages[3]:user",
    ]
    # the next turn's new system message is a change of the system prompt, before the talk
    later = received + [
        seg("message", "messages[4]:assistant", "m4"),
        seg("message", "messages[5]:system", "r2", 5),
    ]
    at = diverge(
        engine_order(received, tools_first=True, hoists_system=True),
        engine_order(later, tools_first=True, hoists_system=True),
    )
    assert (at.part, at.segment) == ("system", "messages[5]:system@head")
    assert at.prefix_tokens == 50 + 100 + 20 + 5  # tools, the system prompt, the first one
    assert at.missed_tokens == 30 + 10 + 10  # the whole conversation after it
    # kept in place, the same turn only appended
    assert diverge(received, later) is None
