"""How an upstream's chat template renders a conversation: what the prefix cache really
sees, learned by rendering small probe conversations, not assumed.

The engine's prefix cache works on the tokens its chat template renders, and templates
re-order. Four facts matter to every cache figure the gateway gives:

- ``tools``: where the tool definitions go (``tools_first``: before the system prompt;
  ``system_first``: after the leading system message(s));
- ``system``: where a *later* ``role: system`` message goes (``in_place``: where the
  client put it; ``hoisted``: gathered into the system prompt at the head, as the DeepSeek
  family's templates do, so that each new one changes the prompt's head; ``dropped``: not
  rendered at all);
- ``reasoning``: an assistant's reasoning in the history (``kept``: always rendered;
  ``until_next_user``: rendered only after the last user query, as the Qwen3 family's
  templates do, so that a new user turn re-renders the whole tool loop before it without
  its reasoning; ``dropped``: never rendered);
- ``same_role``: two consecutive messages of one role (``separate``: each its own turn, so
  appending one leaves the rendering before it as it was; ``merged``: joined into one turn,
  so the earlier one's rendering changes when the next arrives);
- ``tool_results``: consecutive tool results (``separate``: each its own turn, or closed
  where it ends; ``grouped``: gathered in one block closed after the last, as the Qwen3 and
  DeepSeek families' templates do, so that each further result rewrites the block's end);
- how it is known (``source``): a configured template, the engine's ``/tokenize``, or an
  assumption.

Each fact is read from a pair of probes that differ in one place: where their renderings
(token ids or the template's text) first differ says where that place is rendered; the
``same.*`` and ``results.*`` probes (no generation prompt) ask instead whether a shorter
conversation's rendering is the head of a longer one's.
:func:`probes` are the bodies, :func:`from_renderings` reads them (pure; token lists or
strings alike). :mod:`prefixgate.engine.order` asks the engine or the configured
template and keeps the answer per channel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "ASSUMED",
    "PROBES",
    "Rendering",
    "first_difference",
    "from_renderings",
    "probes",
    "render_probes",
]

UNKNOWN = "unknown"
_MEETING = 4  # the tokens where two texts meet, which a tokenizer may split anew


@dataclass(frozen=True, slots=True)
class Rendering:
    """What one upstream's template does with a conversation."""

    tools: str = "tools_first"  # tools_first | system_first
    system: str = UNKNOWN  # in_place | hoisted | dropped | unknown
    reasoning: str = UNKNOWN  # kept | until_next_user | dropped | unknown
    source: str = "assumed (not learned from the upstream yet)"
    same_role: str = UNKNOWN  # separate | merged | unknown
    tool_results: str = UNKNOWN  # separate | grouped | unknown

    @property
    def order(self) -> str:
        """The tools' place (the name ``render_order`` has in the configuration)."""
        return self.tools

    @property
    def hoists_system(self) -> bool:
        return self.system == "hoisted"

    @property
    def drops_past_reasoning(self) -> bool:
        """Whether an assistant's reasoning stops being rendered once a user turn follows."""
        return self.reasoning == "until_next_user"

    def as_dict(self) -> dict[str, str]:
        """The facts by name; ``same_role`` and ``tool_results`` only once the probes told
        them (an upstream asked nothing yet shows the four facts it always had)."""
        out = {
            "tools": self.tools,
            "system": self.system,
            "reasoning": self.reasoning,
            "source": self.source,
        }
        for name in ("same_role", "tool_results"):
            if (value := getattr(self, name)) != UNKNOWN:
                out[name] = value
        return out

    def with_source(self, source: str) -> Rendering:
        return replace(self, source=source)


ASSUMED = Rendering()


def first_difference(a: Sequence, b: Sequence) -> int | None:
    """The first index where two token lists (or strings) differ (None: identical)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _tool(doc: str = "Reads a file.") -> dict:
    """The probes' tool (a new one each time: a probe's body is its own)."""
    return {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": doc,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }


def _later_system(note: str, question: str) -> list[dict]:
    return [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": question},
        {"role": "assistant", "content": "Here is the answer."},
        {"role": "system", "content": note},
        {"role": "user", "content": "And the next one?"},
    ]


def _loop(thought: str, *, new_user_turn: bool) -> list[dict]:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
    }
    out = [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "Fix the bug in a.txt."},
        {"role": "assistant", "content": "", "reasoning_content": thought, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "the file's text"},
    ]
    if new_user_turn:
        out += [
            {"role": "assistant", "content": "Fixed."},
            {"role": "user", "content": "Now run the tests."},
        ]
    return out


def _results(n: int, then: list[dict] | None = None) -> list[dict]:
    calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "read_file", "arguments": f'{{"path": "{i}.txt"}}'},
        }
        for i in (1, 2)
    ]
    out = [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "Read both files."},
        {"role": "assistant", "content": "", "tool_calls": calls},
    ]
    out += [
        {"role": "tool", "tool_call_id": f"call_{i}", "content": f"The text of file {i}."}
        for i in range(1, n + 1)
    ]
    return out + (then or [])


def _body(
    messages: list[dict], tools: list[dict] | None = None, *, generation: bool = True
) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": messages, "add_generation_prompt": generation}
    if tools:
        body["tools"] = tools
    return body


def probes() -> dict[str, dict[str, Any]]:
    """The probe requests (``/tokenize`` bodies without ``model``), by name. Pairs differ
    in one place: ``tools.*`` in the system text or a tool's description, ``system.*``
    in a later system message or the first user message, ``loop.*`` / ``after.*`` in an
    assistant's reasoning, within a tool loop and once a new user turn follows it. The
    ``same.*`` and ``results.*`` conversations (no generation prompt) grow by one message:
    of the same role, or (``*.turn``, the control) of another."""
    sys_msgs = [
        {"role": "system", "content": "Alpha. You are a careful assistant."},
        {"role": "user", "content": "List the files."},
    ]
    sys_changed = [{**sys_msgs[0], "content": "Omega. You are a careful assistant."}, sys_msgs[1]]
    done = [{"role": "assistant", "content": "Both read."}]
    return {
        "tools.base": _body(sys_msgs, [_tool("Lists the files of a directory.")]),
        "tools.system": _body(sys_changed, [_tool("Lists the files of a directory.")]),
        "tools.tool": _body(sys_msgs, [_tool("Shows the files of a directory.")]),
        "system.base": _body(_later_system("Note alpha.", "First question.")),
        "system.later": _body(_later_system("Note omega.", "First question.")),
        "system.user": _body(_later_system("Note alpha.", "First query.")),
        "loop.a": _body(_loop("Think alpha.", new_user_turn=False), [_tool()]),
        "loop.b": _body(_loop("Think omega.", new_user_turn=False), [_tool()]),
        "after.a": _body(_loop("Think alpha.", new_user_turn=True), [_tool()]),
        "after.b": _body(_loop("Think omega.", new_user_turn=True), [_tool()]),
        "same.one": _body(sys_msgs, generation=False),
        "same.two": _body(
            [*sys_msgs, {"role": "user", "content": "Then count them."}], generation=False
        ),
        "same.turn": _body(
            [*sys_msgs, {"role": "assistant", "content": "Here."}], generation=False
        ),
        "results.one": _body(_results(1), [_tool()], generation=False),
        "results.two": _body(_results(2), [_tool()], generation=False),
        "results.turn": _body(_results(1, done), [_tool()], generation=False),
    }


PROBES = tuple(probes())


def from_renderings(got: Mapping[str, Sequence | None], source: str) -> Rendering:
    """The rendering the probes' renderings show (token lists or texts; ``None`` for a
    probe the upstream refused). A fact the probes do not tell stays as assumed
    (``tools_first``) or ``unknown``."""

    def diff(a: str, b: str) -> int | None | bool:
        x, y = got.get(a), got.get(b)
        if x is None or y is None:
            return False  # not told
        return first_difference(x, y)

    tools = ASSUMED.tools
    s, t = diff("tools.base", "tools.system"), diff("tools.base", "tools.tool")
    if s is not False and t is not False and s is not None and t is not None and s != t:
        tools = "system_first" if s < t else "tools_first"
    system = UNKNOWN
    later, user = diff("system.base", "system.later"), diff("system.base", "system.user")
    if later is None:
        system = "dropped"
    elif later is not False and user is not False and user is not None:
        system = "hoisted" if later < user else "in_place"
    reasoning = UNKNOWN
    in_loop, after = diff("loop.a", "loop.b"), diff("after.a", "after.b")
    if in_loop is not False and after is not False:
        if in_loop is None and after is None:
            reasoning = "dropped"
        elif after is None:
            reasoning = "until_next_user"
        else:
            reasoning = "kept"
    return Rendering(
        tools,
        system,
        reasoning,
        source,
        _appended(got, "same", "merged"),
        _appended(got, "results", "grouped"),
    )


def _appended(got: Mapping[str, Sequence | None], name: str, joined: str) -> str:
    """``separate`` when a message of the same role disturbs the shorter rendering no
    earlier than one of another role does (the control: a new turn, which at most re-splits
    the last few tokens where the two texts meet), ``joined`` when it reaches further back
    (the earlier message's end moved after the new one); ``unknown`` when the probes do not
    tell or the control itself rewrites more than the meeting point."""
    one, two, turn = got.get(f"{name}.one"), got.get(f"{name}.two"), got.get(f"{name}.turn")
    if one is None or two is None or turn is None:
        return UNKNOWN
    at_turn, at_two = first_difference(one, turn), first_difference(one, two)
    if at_turn is None or at_two is None or at_turn < len(one) - _MEETING:
        return UNKNOWN
    return "separate" if at_two >= at_turn else joined


def render_probes(render: Callable[[dict[str, Any]], Sequence | None]) -> dict:
    """Every probe through ``render`` (a body to its tokens or text; ``None``: refused)."""
    return {name: render(body) for name, body in probes().items()}
