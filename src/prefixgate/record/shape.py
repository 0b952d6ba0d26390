"""The shape of a change: where a prompt segment's text changed between two requests and
what kind of value changed there, without keeping the text.

A cache breaker is nearly always a value that a client templates into its prompt — a
clock, a date, a request id, a counter — or a list it sends in another order. Knowing
*which kind* of value, and *where*, is enough to name the cause and the fix; the text
itself would be a privacy cost the record does not need to pay (full texts stay opt-in,
``capture_text``). :func:`shape_of` compares the two texts once, at capture time, and
keeps only:

- where the change starts: character offset, ≈ token offset (chars / 4), line and
  paragraph (paragraphs are separated by blank lines) in the segment's text;
- how long the differing span is, before and after;
- a character-class skeleton of the changed value (digits → ``9``, letters → ``a``,
  ``<uuid>``, ``<hex:N>``, ``<b64:N>``; punctuation kept), e.g. ``99:99:99``;
- its class (:data:`CLASSES`).
"""

from __future__ import annotations

import re

import msgspec

from prefixgate.sequences import common_prefix

TIME_OF_DAY = "time_of_day"
DATE = "date"
DATE_TIME = "date_time"
EPOCH = "epoch"
UUID = "uuid"
NONCE = "nonce"
COUNTER = "counter"
REORDERED = "reordered_list"
WHITESPACE = "whitespace"
SERIALIZATION = "serialization"
CONTENT = "content_edit"
COMPACTED = "context_compacted"  # not a breaker: record/compacted.py

# Every class, with what a person calls it.
CLASSES: dict[str, str] = {
    TIME_OF_DAY: "a time of day",
    DATE: "a date",
    DATE_TIME: "a date and time",
    EPOCH: "an epoch timestamp",
    UUID: "a UUID",
    NONCE: "a random token",
    COUNTER: "a counter",
    REORDERED: "a reordered list",
    WHITESPACE: "whitespace",
    SERIALIZATION: "JSON serialization (key order or number format)",
    CONTENT: "a content edit",
    COMPACTED: "a compacted context (a new history by design, or its summary request)",
}


class Shape(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Where and what changed in one segment, without its text."""

    cls: str
    char_offset: int = 0  # in the segment's text (the newer request's)
    token_offset: int = 0  # ≈ char_offset / 4
    line: int = 1
    paragraph: int = 1
    old_chars: int = 0  # length of the differing value, before and after
    new_chars: int = 0
    old_skeleton: str = ""
    new_skeleton: str = ""
    text_chars: int = 0  # the segment's text length
    detail: str = ""  # e.g. "27 items, same set" or "JSON key order"


_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?"
_WEEKDAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*\.?,?"
_TIME = r"\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:\s?[AaPp]\.?[Mm]\.?)?"
_ZONE = r"(?:\s?(?:Z|UTC|GMT|[+-]\d{2}:?\d{2}))?"
_DATE = (
    rf"\d{{4}}-\d{{1,2}}-\d{{1,2}}|\d{{4}}/\d{{1,2}}/\d{{1,2}}|\d{{1,2}}/\d{{1,2}}/\d{{2,4}}"
    rf"|(?:{_WEEKDAY}\s)?{_MONTH}\s\d{{1,2}}(?:st|nd|rd|th)?,?\s\d{{4}}"
    rf"|(?:{_WEEKDAY}\s)?\d{{1,2}}\s{_MONTH},?\s\d{{4}}"
    rf"|{_WEEKDAY}\s{_MONTH}\s\d{{1,2}}"
)
# The most specific first: a match of an earlier pattern wins.
_VALUES: list[tuple[str, re.Pattern[str]]] = [
    (
        UUID,
        re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
    ),
    (DATE_TIME, re.compile(rf"(?:{_DATE})(?:[T ]|,?\s(?:at\s)?){_TIME}{_ZONE}")),
    (DATE, re.compile(_DATE)),
    (TIME_OF_DAY, re.compile(rf"(?<![\d:]){_TIME}{_ZONE}(?![\d:])")),
    (EPOCH, re.compile(r"(?<![\d.])1[5-9]\d{8}(?:\d{3}|\.\d+)?(?![\d])")),
]
_WINDOW = 48  # characters around the change searched for a value
_WORD = re.compile(r"[A-Za-z0-9_\-]")
_INT = re.compile(r"[+-]?\d+")
COUNTER_STEP = 1000  # integers at most this far apart count as a counter
_HEXISH = re.compile(r"[0-9a-fA-F]+")
_WORDS = re.compile(r"[A-Za-z0-9]+")
_HEX = re.compile(r"(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{5,}")
_B64 = re.compile(r"(?=\S*\d)(?=\S*[a-z])(?=\S*[A-Z])[A-Za-z0-9+/_\-]{12,}={0,2}")
_UUID_ANY = _VALUES[0][1]
_SKELETON_RUNS = re.compile(
    _UUID_ANY.pattern + r"|(?=[A-Za-z0-9+/_\-]*\d)(?=[A-Za-z0-9+/_\-]*[a-z])"
    r"(?=[A-Za-z0-9+/_\-]*[A-Z])[A-Za-z0-9+/_\-]{16,}={0,2}"
    r"|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{5,}\b"
)
_PARAGRAPH = re.compile(r"\n[ \t]*\n")
SKELETON_MAX = 48


def skeleton(value: str, limit: int = SKELETON_MAX) -> str:
    """The character classes of ``value``: ``2026-08-17 09:12:33`` → ``9999-99-99
    99:99:99``, a UUID → ``<uuid>``, ``8c7f0`` → ``<hex:5>``, a long mixed-case token →
    ``<b64:N>``; other punctuation kept, whitespace as one space, newlines as ``⏎``."""
    out: list[str] = []
    pos = 0
    for m in _SKELETON_RUNS.finditer(value):
        out.append(_classes(value[pos : m.start()]))
        run = m.group(0)
        if _UUID_ANY.fullmatch(run):
            out.append("<uuid>")
        elif re.fullmatch(r"[0-9a-f]+", run):
            out.append(f"<hex:{len(run)}>")
        else:
            out.append(f"<b64:{len(run)}>")
        pos = m.end()
    out.append(_classes(value[pos:]))
    text = "".join(out)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _classes(s: str) -> str:
    out = []
    for ch in s:
        if ch.isdigit():
            out.append("9")
        elif ch.isalpha():
            out.append("a")
        elif ch == "\n":
            out.append("⏎")
        elif ch.isspace():
            if not out or out[-1] != " ":
                out.append(" ")
        else:
            out.append(ch)
    return "".join(out)


def common_suffix(a: str | bytes, b: str | bytes, most: int) -> int:
    """Length of the common suffix, at most ``most``."""
    la, lb = len(a), len(b)
    lo, hi = 0, min(most, la, lb)
    if a[la - hi :] == b[lb - hi :]:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[la - mid : la - lo] == b[lb - mid : lb - lo]:
            lo = mid
        else:
            hi = mid
    return lo


def _position(text: str, start: int) -> tuple[int, int]:
    """1-based line and paragraph of ``text[start]``."""
    head = text[:start]
    return head.count("\n") + 1, len(_PARAGRAPH.findall(head)) + 1


def shape_of(old: str, new: str) -> Shape | None:
    """The shape of the change from ``old`` to ``new`` (None when they are equal)."""
    if old == new:
        return None
    p = common_prefix(old, new)
    s = common_suffix(old, new, min(len(old), len(new)) - p)
    old_end, new_end = len(old) - s, len(new) - s
    line, paragraph = _position(new, p)
    shape = Shape(
        cls=CONTENT,
        char_offset=p,
        token_offset=p // 4,
        line=line,
        paragraph=paragraph,
        text_chars=len(new),
    )
    if "".join(old.split()) == "".join(new.split()):
        return _spanned(shape, WHITESPACE, old[p:old_end], new[p:new_end])
    reordered = _reordered_lines(old, new)
    if reordered:
        shape.cls, shape.detail = REORDERED, f"{reordered} lines, same set, other order"
        shape.old_chars = old_end - p
        shape.new_chars = new_end - p
        return shape
    value = _value_at(new, p, new_end)
    if value is not None:
        cls, v_start, v_end = value
        start = min(v_start, p)
        end = max(v_end, new_end)
        o_end = end - (len(new) - len(old))
        shape.char_offset, shape.token_offset = start, start // 4
        shape.line, shape.paragraph = _position(new, start)
        return _spanned(shape, cls, old[start:o_end], new[start:end])
    # Not a known value: the whole word around the change.
    start = p
    while start > 0 and _WORD.match(new[start - 1]):
        start -= 1
    grow = 0
    while new_end + grow < len(new) and _WORD.match(new[new_end + grow]):
        grow += 1
    a, b = old[start : old_end + grow], new[start : new_end + grow]
    shape.char_offset, shape.token_offset = start, start // 4
    return _spanned(shape, _token_class(a, b), a, b)


def _spanned(shape: Shape, cls: str, a: str, b: str) -> Shape:
    shape.cls = cls
    shape.old_chars, shape.new_chars = len(a), len(b)
    shape.old_skeleton, shape.new_skeleton = skeleton(a), skeleton(b)
    return shape


def _value_at(text: str, start: int, end: int) -> tuple[str, int, int] | None:
    """The first known value (by class order) whose match overlaps ``text[start:end]``
    (or touches ``start`` for an insertion)."""
    lo = max(0, start - _WINDOW)
    window = text[lo : end + _WINDOW]
    for cls, pattern in _VALUES:
        for m in pattern.finditer(window):
            a, b = m.start() + lo, m.end() + lo
            if a <= max(start, end - 1) and b >= start + (1 if end > start else 0):
                return cls, a, b
    return None


def _token_class(a: str, b: str) -> str:
    """The class of one changed word: a counter (integers a little apart), a nonce
    (random hex, digits or a base64 id of the same length), else a content edit; words
    separated by punctuation (``v=a3f; cch=8c7f0``) are judged one by one."""
    if _INT.fullmatch(a) and _INT.fullmatch(b):
        if 0 < abs(int(b) - int(a)) <= COUNTER_STEP:
            return COUNTER
        return NONCE if len(a) == len(b) >= 4 else CONTENT
    if b and (_HEX.fullmatch(b) or _B64.fullmatch(b)):
        return NONCE
    if (
        len(a) == len(b) >= 3
        and _HEXISH.fullmatch(a)
        and _HEXISH.fullmatch(b)
        and re.search(r"[a-fA-F]", a + b)
        and re.search(r"\d", a + b)
    ):
        return NONCE
    wa, wb = _WORDS.findall(a), _WORDS.findall(b)
    if 1 < len(wa) == len(wb) and _WORDS.sub("", a) == _WORDS.sub("", b):
        classes = {_token_class(x, y) for x, y in zip(wa, wb, strict=True) if x != y}
        if len(classes) == 1:
            return classes.pop()
    return CONTENT


def _reordered_lines(old: str, new: str) -> int:
    """The number of lines when ``new`` is ``old`` with its lines in another order."""
    a, b = old.split("\n"), new.split("\n")
    if len(a) < 2 or len(a) != len(b) or sorted(a) != sorted(b):
        return 0
    return len(a)


def json_shape(old: bytes, new: bytes, *, same_value: bool) -> Shape:
    """The shape of a change in a segment's JSON when its text is unchanged:
    serialization (``same_value``: the same JSON value, written differently — key order,
    number format, spacing) or another field's edit. Offsets are in the JSON text."""
    a, b = old.decode("utf-8", "replace"), new.decode("utf-8", "replace")
    shape = shape_of(a, b) or Shape(cls=CONTENT)
    if same_value:
        shape.cls = SERIALIZATION
        shape.detail = "JSON key order" if _key_order_differs(a, b) else "number or spacing"
    elif shape.cls in (WHITESPACE, REORDERED):
        shape.cls = CONTENT
    return shape


def _key_order_differs(a: str, b: str) -> bool:
    try:
        x, y = msgspec.json.decode(a), msgspec.json.decode(b)
    except msgspec.DecodeError:
        return False
    return _keys(x) != _keys(y)


def _keys(v: object) -> list:
    if isinstance(v, dict):
        return [(k, _keys(x)) for k, x in v.items()]
    if isinstance(v, list):
        return [_keys(x) for x in v]
    return []


def reordered_list(count: int, what: str) -> Shape:
    """A list sent with the same items in another order (tools, skills, files)."""
    return Shape(cls=REORDERED, detail=f"{count} {what}, same set, other order")


__all__ = ["CLASSES", "Shape", "json_shape", "reordered_list", "shape_of", "skeleton"]
