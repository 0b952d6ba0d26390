"""The one validation layer every entry point's body goes through before a protocol reads
it: the bytes are UTF-8 and hold no lone UTF-16 surrogate escape, and the numbers and
tool definitions the gateway forwards have the shape their protocol gives them.

Every inference route and ``count_tokens`` reach :func:`check_text` through
``common.check_body_bytes``, before any decode, so a body the gateway would forward
verbatim (a chat request's ``messages`` and ``tools`` stay raw bytes) is held to the same
rule as the fields it decodes: what the client got wrong is answered 400 in its protocol,
never a 500, and never reaches an upstream.

Cost: an ASCII body is one ``bytes.isascii`` pass (no copy); another is decoded once
(CPython's UTF-8 decoder, about a byte a cycle) and dropped. Lone surrogate escapes cost
nothing on the way of a good request: every entry point decodes the whole body with
msgspec (the fields it keeps raw included: ``msgspec.Raw`` is skipped over, escapes
checked), and msgspec refuses a lone surrogate escape, in a decoded string or a skipped
one. Only then, on the error's way, is the body searched for the escape
(:func:`not_json`), so that the answer names it.
"""

from __future__ import annotations

import math

from prefixgate.errors import InvalidRequest

# The largest token count accepted for max_tokens & co.: what engines hold in an int32.
MAX_TOKENS = 2**31 - 1

_HEX = frozenset(b"0123456789abcdefABCDEF")
_BACKSLASH = 92


def check_text(raw: bytes) -> None:
    """Refuse a body that is not UTF-8 (its escapes are msgspec's to check: :func:`not_json`)."""
    if not raw.isascii():
        try:
            raw.decode()
        except UnicodeDecodeError as exc:
            raise InvalidRequest(
                f"request body is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
                f"{exc.start}); JSON must be sent as UTF-8"
            ) from None


def not_json(raw: bytes, exc: Exception) -> InvalidRequest:
    """The error for a body msgspec refused: a lone UTF-16 surrogate escape named where it
    is (msgspec refuses those too, with a message that does not say so), else msgspec's
    own reason."""
    if b"\\u" in raw:
        _check_surrogates(raw)
    return InvalidRequest(f"request body is not valid JSON: {exc}")


def _check_surrogates(raw: bytes) -> None:
    """Each ``\\uD800``-``\\uDBFF`` escape followed by a ``\\uDC00``-``\\uDFFF`` one, and each
    of those preceded by one. An escape is one whose backslash is not itself escaped (an
    even run of backslashes before it). The escapes are found with ``bytes.find`` on
    ``\\u`` (its first byte is rare in JSON, so the search skips from one to the next): a
    regular expression tried at every byte costs ~20 ms on a 50 KB body, and a search for
    ``\\ud`` over the whole body ten times what this does."""
    at = _find_all(raw, b"\\u")
    paired = set()
    for i in at:
        if raw[i + 2 : i + 3] not in (b"d", b"D"):
            continue
        j = i
        while j > 0 and raw[j - 1] == _BACKSLASH:
            j -= 1
        if (i - j) % 2:  # an escaped backslash, then text
            continue
        unit = _unit(raw, i)
        if unit is None or unit < 0xD800:
            continue  # \\ud7ff and below are not surrogates; a bad escape is the decoder's
        if unit <= 0xDBFF:
            low = _unit(raw, i + 6) if raw[i + 6 : i + 8] == b"\\u" else None
            if low is not None and 0xDC00 <= low <= 0xDFFF:
                paired.add(i + 6)
                continue
        elif i in paired:
            continue
        raise InvalidRequest(
            f"request body holds a lone UTF-16 surrogate (\\u{unit:04x} at offset {i}): a "
            "JSON string must be valid Unicode"
        )


def _find_all(raw: bytes, needle: bytes) -> list[int]:
    out = []
    i = raw.find(needle)
    while i >= 0:
        out.append(i)
        i = raw.find(needle, i + 2)
    return out


def _unit(raw: bytes, i: int) -> int | None:
    """The UTF-16 unit of the ``\\uXXXX`` escape at ``i``, or None if it is not one."""
    digits = raw[i + 2 : i + 6]
    if len(digits) != 4 or not all(c in _HEX for c in digits):
        return None
    return int(digits, 16)


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
