"""Where a request's messages stand in its body, byte by byte: the top level up to the
messages array when only plain values come before it (Claude Code's
``{"model":"…","messages":[…``), each message's place, the array's end, and whether a
second ``messages`` key follows it. Used by the decode that reads only what is new in
place (``messages_body``): what it takes from the previous request is found here, and
anything not as expected sends the request to the whole decode."""

from __future__ import annotations

import re

import msgspec
from msgspec import Raw, Struct

__all__ = ["places_of", "single", "starts_of"]

# The top level up to its messages' first item, when only plain values come before them
# (Claude Code: {"model":"…","messages":[…): where a request's messages begin.
_WS = rb"[ \t\n\r]*"
_STRING = rb'"(?:[^"\\\x00-\x1f]|\\.)*"'
_SCALAR = rb"(?:" + _STRING + rb"|-?[0-9][0-9.eE+-]*|true|false|null)"
_HEAD = re.compile(
    _WS + rb"\{" + _WS + rb"(?:" + _STRING + _WS + rb":" + _WS + _SCALAR + _WS + rb"," + _WS
    + rb')*"messages"' + _WS + rb":" + _WS + rb"\[" + _WS
)  # fmt: skip
_NEXT = re.compile(_WS + rb"," + _WS)
_AFTER = re.compile(_WS + rb"(?:(,)|\})")  # after the messages: more keys, or the end


class _Rest(Struct):
    """The top level's keys after its messages: whether a second messages key is there."""

    messages: Raw = Raw(b"")


_REST = msgspec.json.Decoder(_Rest)
_CLOSE = re.compile(_WS + rb"\]")
_BLANKS = (b" ", b"\t", b"\n", b"\r", b"")
# one of the letters of "messages" written as a \u escape
_ESCAPED_LETTER = re.compile(rb"\\u00(?:6[dD157]|73)")


def places_of(raw: bytes, pos: int, msgs: list[Raw], places: list[int]) -> int:
    """Append to ``places`` where each of ``msgs`` begins in ``raw``, the first at
    ``pos``: each one's very bytes there, a comma between each and the next, the array's
    end after the last. Where the array ends (just after its ``]``); -1 when ``raw``
    does not hold them so."""
    last = len(msgs) - 1
    for i, m in enumerate(msgs):
        if not raw.startswith(m, pos):
            return -1
        places.append(pos)
        end = pos + len(m)
        if i < last:
            if raw[end : end + 1] == b"," and raw[end + 1 : end + 2] not in _BLANKS:
                pos = end + 1
                continue
            sep = _NEXT.match(raw, end)
        else:
            if raw[end : end + 1] == b"]":
                return end + 1
            sep = _CLOSE.match(raw, end)
        if sep is None:
            return -1
        pos = sep.end()
    return pos if last >= 0 else -1


def starts_of(raw: bytes, msgs: list[Raw]) -> tuple[list[int], int] | None:
    """Where each of the request's messages begins in its body, and where what follows
    them begins (``None``: not known, when anything but plain values comes before them,
    they are not where they should be, or a second messages key follows them)."""
    head = _HEAD.match(raw)
    if head is None or not msgs:
        return None
    places: list[int] = []
    end = places_of(raw, head.end(), msgs, places)
    if end < 0 or not single(raw, end):
        return None
    return places, end


def single(raw: bytes, end: int) -> bool:
    """No second messages key after the array ending at ``end`` (JSON leaves open which
    of two counts; the decode takes the last), the object's end there or more keys."""
    after = _AFTER.match(raw, end)
    if after is None:
        return False
    if not after.group(1):
        return True
    at = after.end()
    # A key read as "messages" has its text, or one of its letters as a \u escape: with
    # neither there (searches in C), there is no such key; else the keys are read.
    if raw.find(b'messages"', at) < 0 and _ESCAPED_LETTER.search(raw, at) is None:
        return True
    return not _REST.decode(b"{" + raw[at:]).messages
