"""The one validation layer every entry point's body goes through before a protocol reads
it: the bytes are UTF-8 and hold no lone UTF-16 surrogate escape, and the numbers and
tool definitions the gateway forwards have the shape their protocol gives them.

Every inference route and ``count_tokens`` reach :func:`check_text` through
``common.check_body_bytes``, before any decode, so a body the gateway would forward
verbatim (a chat request's ``messages`` and ``tools`` stay raw bytes) is held to the same
rule as the fields it decodes: what the client got wrong is answered 400 in its protocol,
never a 500, and never reaches an upstream.

Cost: an ASCII body is one ``bytes.isascii`` pass (no copy); another is decoded once
(CPython's UTF-8 decoder, about a byte a cycle) and dropped. Surrogate escapes are looked
for with two substring searches and only parsed when one is there.
"""

from __future__ import annotations

import math
import re

from prefixgate.errors import InvalidRequest

# The largest token count accepted for max_tokens & co.: what engines hold in an int32.
MAX_TOKENS = 2**31 - 1

# A \\uD800-\\uDFFF escape that is not itself escaped (an even run of backslashes before
# it), with the low half that may follow a high one.
_SURROGATE = re.compile(
    rb"(?<!\\)(?:\\\\)*\\u([dD][89a-fA-F][0-9a-fA-F]{2})(\\u[dD][c-fC-F][0-9a-fA-F]{2})?"
)


def check_text(raw: bytes) -> None:
    """Refuse a body that is not UTF-8, or whose JSON escapes name half a UTF-16 pair."""
    if not raw.isascii():
        try:
            raw.decode()
        except UnicodeDecodeError as exc:
            raise InvalidRequest(
                f"request body is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
                f"{exc.start}); JSON must be sent as UTF-8"
            ) from None
    if b"\\ud" in raw or b"\\uD" in raw:
        for m in _SURROGATE.finditer(raw):
            first = m.group(1)
            high = first[1:2].lower() in b"89ab"
            if not high or m.group(2) is None:
                raise InvalidRequest(
                    f"request body holds a lone UTF-16 surrogate (\\u{first.decode()} at "
                    f"offset {m.start(1) - 2}): a JSON string must be valid Unicode"
                )


def check_count(body: dict, name: str, *, required: bool = False) -> None:
    """A token count (``max_tokens`` …): absent (unless required), or an integer from 1 to
    :data:`MAX_TOKENS`."""
    v = body.get(name)
    if v is None and not required:
        return
    if type(v) is not int or not 1 <= v <= MAX_TOKENS:
        raise InvalidRequest(
            f"{name}: a positive integer (at most {MAX_TOKENS}) is required", param=name
        )


def check_number(body: dict, name: str, low: float, high: float) -> None:
    """A sampling number: absent, null, or a finite number within ``[low, high]``."""
    v = body.get(name)
    if v is None:
        return
    if type(v) not in (int, float) or not (math.isfinite(v) and low <= v <= high):
        raise InvalidRequest(f"{name}: a number from {low:g} to {high:g} is required", param=name)
