"""Later system messages delivered so that they render where the client put them.

Claude Code sends ``role: system`` messages in the middle of a conversation (its
environment, and with the ``<total_tokens>`` reminder on, a new one after every user
prompt and tool result, earlier ones unchanged). The gateway keeps them in place. But the
chat templates of the DeepSeek family gather *every* system message into one system
prompt at the head of the prompt, so each new one changes the head and the engine
recomputes the whole conversation at every turn (docs/rendering.md).

For an upstream whose template was seen to do that (the gateway's
:class:`~prefixgate.engine.order.RenderOrders`),
each system message after the conversation's start is delivered as a clearly marked part
of the client's turn it follows, which the template renders in place::

    <system>
    …the system message's text…
    </system>

- after a user message: appended to it (a text block of its own, or after a blank line
  when its content is a string);
- after anything else (an assistant turn, or a user turn of tool results only): a user
  message of its own holding just that.

What the model is told is the same text, at the same place in the conversation, marked
as the system's. The leading system messages (the system prompt) are untouched, and an
empty system message, which tells the model nothing, is left out. The transform of a
message depends only on the messages before it, so a later request, which appends to the
conversation, renders every earlier turn exactly as before. A request gets the very
messages made for the previous one where it re-sends the very messages they were made of
(:class:`_Made`): the steps after this one (the conversion, the upstream body's encode,
the capture) take what the previous turn sent again by identity, so a turn costs its new
tail here as everywhere (docs/performance.md).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable

import msgspec

from prefixgate.protocol.messages_body import Message, Request, TextBlock

__all__ = [
    "CHAT_ROLES",
    "CLOSE",
    "OPEN",
    "system_in_place",
    "system_in_place_chat",
    "system_in_place_typed",
]

OPEN = "<system>\n"
CLOSE = "\n</system>"
_encode = msgspec.json.encode
_decode = msgspec.json.decode


def _leading(roles: list[str]) -> int:
    """How many messages open the conversation as system messages."""
    n = 0
    while n < len(roles) and roles[n] == "system":
        n += 1
    return n


# -- the typed request (the gateway's path) ----------------------------------------------
class _Made:
    """What ``make`` made lately of two messages (the one before a system message, or
    None, and the system message), by the very messages: an agent's next request re-sends
    its earlier messages as the same structs (the decode lends them) and gets the same
    made messages back. At most ``limit`` kept, least recently used first out; each keeps
    the messages it was made of, so that their ids are not reused meanwhile."""

    def __init__(
        self, make: Callable[[Message | None, Message], Message | None], limit: int = 4096
    ) -> None:
        self._d: OrderedDict[tuple[int, int], tuple] = OrderedDict()
        self.make, self.limit = make, limit

    def __call__(self, before: Message | None, m: Message) -> Message | None:
        key = (id(before), id(m))
        got = self._d.get(key)
        if got is not None and got[0] is before and got[1] is m:
            with contextlib.suppress(KeyError):  # (gone meanwhile: gateways on threads)
                self._d.move_to_end(key)
            return got[2]
        made = self.make(before, m)
        self._d[key] = (before, m, made)
        if len(self._d) > self.limit:
            self._d.popitem(last=False)
        return made


def _typed_text(m: Message) -> str:
    if type(m.content) is str:
        return m.content
    return "\n".join(_decode(b.text) for b in m.content if type(b) is TextBlock)


def system_in_place_typed(req: Request) -> tuple[Request, bool]:
    """``req`` with its later system messages moved into the client's turns."""
    messages = req.messages
    lead = _leading([m.role for m in messages])
    if not any(m.role == "system" for m in messages[lead:]):
        return req, False
    out: list[Message] = list(messages[:lead])
    for m in messages[lead:]:
        if m.role != "system":
            out.append(m)
            continue
        prev = out[-1] if len(out) > lead else None
        made = _MADE(prev, m)
        if made is None:  # an empty system message: left out
            continue
        if prev is not None and prev.role == "user":
            out[-1] = made
        else:
            out.append(made)
    return msgspec.structs.replace(req, messages=out), True


def _delivered(prev: Message | None, m: Message) -> Message | None:
    """The system message ``m`` as a part of the client's turn: the user message ``prev``
    with it after it, or a user message of its own (``prev`` is not a user's); None when
    it is empty."""
    text = _typed_text(m)
    if not text:
        return None
    marked = OPEN + text + CLOSE
    if prev is None or prev.role != "user":
        return Message("user", marked)
    if type(prev.content) is str:
        return Message("user", prev.content + "\n\n" + marked)
    return Message("user", [*prev.content, TextBlock(msgspec.Raw(_encode(marked)))])


_MADE = _Made(_delivered)


# -- a plain request (count_tokens) -----------------------------------------------------
def _plain_text(m: dict) -> str:
    content = m.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def system_in_place(body: dict) -> tuple[dict, bool]:
    """:func:`system_in_place_typed` for a plain Messages request."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return body, False
    out, changed = _moved(messages, ("system",))
    return ({**body, "messages": out}, True) if changed else (body, False)


# -- an OpenAI Chat conversation (the Chat and Responses paths) -------------------------
CHAT_ROLES = ("system", "developer")


def system_in_place_chat(messages: list) -> tuple[list, bool]:
    """A Chat conversation's later ``system`` and ``developer`` messages (after the
    leading run of them) delivered in the client's turns, as on the Messages path: a text
    part (or a blank line and the text) added to the user message they follow, else a user
    message of their own; a tool result is no user message. Raw texts are read as JSON."""
    return _moved(messages, CHAT_ROLES)


def _content(m: dict):
    content = m.get("content")
    return _decode(content) if type(content) is msgspec.Raw else content


def _moved(messages: list, roles: tuple[str, ...]) -> tuple[list, bool]:
    kinds = [m.get("role") if isinstance(m, dict) else None for m in messages]
    later = [k in roles for k in kinds]
    lead = 0
    while lead < len(later) and later[lead]:
        lead += 1
    if not any(later[lead:]):
        return messages, False
    out: list = list(messages[:lead])
    for m, is_system in zip(messages[lead:], later[lead:], strict=True):
        if not is_system:
            out.append(m)
            continue
        text = _plain_text({"content": _content(m)})
        if not text:
            continue
        marked = OPEN + text + CLOSE
        prev = out[-1] if len(out) > lead else None
        if isinstance(prev, dict) and prev.get("role") == "user":
            content = _content(prev)
            if isinstance(content, list):
                new = [*content, {"type": "text", "text": marked}]
            else:
                new = (content if isinstance(content, str) else "") + "\n\n" + marked
            out[-1] = {**prev, "content": new}
        else:
            out.append({"role": "user", "content": marked})
    return out, True
