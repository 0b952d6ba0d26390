"""A stream's chunk template: most chunks of a chat stream are one engine's same bytes
but for the piece of text they carry, so a read that is such a chunk is recognised by its
two ends and its piece read without decoding the chunk.

An engine writes every chunk of a stream the same way (vLLM and SGLang: the same ``id``,
``created`` and ``model``, compact JSON, the fields in one order); the bulk of a stream is
chunks whose delta is one string (``content``, or ``reasoning_content`` / ``reasoning``)
and nothing else. :func:`cut` cuts such a chunk, once seen, around that string into a
:class:`Template`: ``data: `` and the bytes before the string's value (``head``), the
bytes after it and the event's end (``tail``). :meth:`Template.piece` then takes a read
that is ``head`` + a JSON string + ``tail`` and gives the string: the read is exactly one
event (neither end holds a line break, and a JSON string cannot), and its JSON is the
template's but for that one string, so it means what the template's chunk meant with
another piece. Anything else (another engine's field order, an escaped quote in the
template's piece, an ``id`` that changes per chunk, a read of two events or half of one)
does not match and takes the decoding path: the bytes sent are the same either way.
"""

from __future__ import annotations

import msgspec

__all__ = ["KEYS", "Template", "cut"]

_decode = msgspec.json.decode
_QUOTE = 34  # ord('"')
# The delta keys whose string value is a piece, by the kind of piece (as the walk of
# ``chunks.py`` reads them: ``reasoning_content`` first).
KEYS = {
    "text": (b'"content":',),
    "reasoning": (b'"reasoning_content":', b'"reasoning":'),
}


class Template:
    """One chunk's bytes around its piece; ``kind`` and ``key`` say which piece.

    The relays match a read against a template inline, a read at a time, from
    ``ends`` (``head``, ``len(head)``, ``tail``, ``-len(tail)``): what :meth:`piece` does,
    without a call (``apis/chat/steps.py``, ``pipeline/relays.py``; tests/pipeline/test_relay_templates.py holds
    them to it)."""

    __slots__ = ("head", "tail", "kind", "key", "ends")

    def __init__(self, head: bytes, tail: bytes, kind: str, key: bytes) -> None:
        self.head, self.tail, self.kind, self.key = head, tail, kind, key
        self.ends = (head, len(head), tail, -len(tail))

    def piece(self, read: bytes) -> str | None:
        """The string of a read that is ``head`` + one JSON string + ``tail`` (None when
        it is not)."""
        head, h, tail, t = self.ends
        if read[:h] != head or read[t:] != tail:
            return None
        tok = read[h:t]
        # A string and nothing else: quotes at both ends (no whitespace, which a decode
        # would allow), decoded by msgspec (no raw control character, valid UTF-8).
        if len(tok) < 2 or tok[0] != _QUOTE or tok[-1] != _QUOTE:
            return None
        try:
            return _decode(tok)
        except msgspec.DecodeError:
            return None


def cut(data: bytes, key: bytes) -> tuple[bytes, bytes] | None:
    """(head, tail) of the event ``data: {data}`` cut around the string value of ``key``
    (its one occurrence in ``data``); None when it cannot be cut: ``key`` absent or
    repeated, its value not a string, empty or holding a backslash, or a line break in
    ``data``."""
    start = data.find(key)
    if start < 0 or data.find(key, start + 1) >= 0:
        return None
    start += len(key)
    end = data.find(b'"', start + 1)
    if data[start : start + 1] != b'"' or end <= start + 1 or data.find(b"\\", start, end) >= 0:
        return None
    if data.find(b"\n") >= 0 or data.find(b"\r") >= 0:
        return None
    return b"data: " + data[:start], data[end + 1 :] + b"\n\n"
