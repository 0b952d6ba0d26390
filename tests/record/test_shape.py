"""The shape of a change: each class of value a client templates into its prompt is told
apart, located (offset, line, paragraph) and reduced to a skeleton without its text."""

from __future__ import annotations

import re

import pytest

from prefixgate.record.shape import (
    CLASSES,
    json_shape,
    reordered_list,
    shape_of,
    skeleton,
)

INTRO = "You are an agent that helps with code.\n\n"

CASES = [
    # (class, old, new, skeleton of the new value)
    (
        "time_of_day",
        f"{INTRO}Current time: 09:12:33.\nBe brief.",
        f"{INTRO}Current time: 09:13:10.\nBe brief.",
        "99:99:99",
    ),
    ("time_of_day", "It is 9:05 PM here", "It is 9:41 PM here", "9:99 aa"),
    ("date", "Today's date is 2026-08-17.", "Today's date is 2026-08-18.", "9999-99-99"),
    ("date", "Date: August 17, 2026", "Date: August 18, 2026", "aaaaaa 99, 9999"),
    ("date", "Today is Mon Aug 17 2026.", "Today is Tue Aug 18 2026.", "aaa aaa 99 9999"),
    (
        "date_time",
        "[2026-08-17T09:12:33Z] start",
        "[2026-08-17T09:12:41Z] start",
        "9999-99-99a99:99:99a",
    ),
    (
        "date_time",
        "at 2026-08-17 09:12:33 UTC",
        "at 2026-08-17 09:14:02 UTC",
        "9999-99-99 99:99:99 aaa",
    ),
    ("epoch", "ts=1786924800 go", "ts=1786924812 go", "9999999999"),
    ("epoch", "now: 1786924800123", "now: 1786924812456", "9999999999999"),
    (
        "uuid",
        "trace 3f2b8c1e-1111-4222-8333-944455556666 on",
        "trace 9a0c7d2f-5555-4666-9777-a88899990000 on",
        "<uuid>",
    ),
    ("nonce", "v=2.1.332.a3f; cch=8c7f0;", "v=2.1.332.a3f; cch=7ee55;", "<hex:5>"),
    ("nonce", "cch=8c7f0;", "cch=69201;", "99999"),
    ("nonce", "req Ab3dEf9hIj2kLm7Q x", "req Zq8wEr5tYu1iOp3W x", "<b64:16>"),
    ("counter", "This is turn 41 of the task.", "This is turn 42 of the task.", "99"),
    ("content_edit", "Use tabs for indentation.", "Use spaces for indentation.", "aaaaaa"),
]


@pytest.mark.parametrize(
    ("cls", "old", "new", "skel"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_each_class_is_told_apart_with_its_skeleton(cls, old, new, skel):
    shape = shape_of(old, new)
    assert shape is not None
    assert shape.cls == cls
    assert shape.new_skeleton == skel
    assert cls in CLASSES
    # the shape holds no character of the value itself, only its classes
    changed = new[shape.char_offset : shape.char_offset + shape.new_chars]
    assert any(ch.isalnum() for ch in changed)
    plain = re.sub(r"<(?:uuid|hex:\d+|b64:\d+)>", "", shape.new_skeleton)
    assert all(ch in "9a" or not ch.isalnum() for ch in plain)


def test_where_the_change_starts_line_and_paragraph():
    old = f"{INTRO}Rules follow.\nCurrent time: 09:12:33\nMore."
    new = f"{INTRO}Rules follow.\nCurrent time: 09:12:58\nMore."
    shape = shape_of(old, new)
    assert shape.char_offset == new.index("09:12:58")
    assert shape.token_offset == shape.char_offset // 4
    assert (shape.line, shape.paragraph) == (4, 2)
    assert (shape.old_chars, shape.new_chars) == (8, 8)
    assert shape.text_chars == len(new)


def test_a_date_and_time_wins_over_the_time_alone():
    # only the seconds differ, but the value is a whole date-time
    shape = shape_of("at 2026-08-17 09:12:33.", "at 2026-08-17 09:12:34.")
    assert shape.cls == "date_time"
    assert shape.char_offset == 3 and shape.new_chars == len("2026-08-17 09:12:34")


def test_whitespace_only():
    shape = shape_of("a b\n\nc", "a b\n\n\nc")
    assert shape.cls == "whitespace"
    assert shape.new_skeleton == "⏎"


def test_lines_in_another_order_are_a_reordered_list():
    old = "Skills:\n- commit\n- review\n- deploy"
    new = "Skills:\n- deploy\n- commit\n- review"
    shape = shape_of(old, new)
    assert shape.cls == "reordered_list"
    assert shape.detail == "4 lines, same set, other order"


def test_json_key_order_is_serialization_not_content():
    a = b'{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}'
    b = b'{"required":["path"],"properties":{"path":{"type":"string"}},"type":"object"}'
    shape = json_shape(a, b, same_value=True)
    assert shape.cls == "serialization" and shape.detail == "JSON key order"
    number = json_shape(b'{"n":1.0}', b'{"n":1}', same_value=True)
    assert number.cls == "serialization" and number.detail == "number or spacing"
    edited = json_shape(b'{"n":1}', b'{"n":2}', same_value=False)
    assert edited.cls != "serialization"


def test_equal_texts_have_no_shape():
    assert shape_of("same", "same") is None


def test_a_list_of_tools_reordered():
    shape = reordered_list(27, "tools")
    assert shape.cls == "reordered_list" and shape.detail == "27 tools, same set, other order"


def test_skeleton():
    assert skeleton("2026-08-17 09:12:33") == "9999-99-99 99:99:99"
    assert skeleton("3f2b8c1e-1111-4222-8333-944455556666") == "<uuid>"
    assert skeleton("cch=8c7f0;") == "aaa=<hex:5>;"
    assert skeleton("line one\nline two") == "aaaa aaa⏎aaaa aaa"
    assert len(skeleton("x" * 500)) == 48


@pytest.mark.parametrize("size", [10, 1000, 200_000])
def test_long_texts_are_compared_by_halving(size):
    """The common prefix and suffix are found on texts of any size; the change is where
    it is, not at a page boundary."""
    base = "word " * size
    old = base + "Current time: 09:12:33 " + base
    new = base + "Current time: 09:12:34 " + base
    shape = shape_of(old, new)
    assert shape.cls == "time_of_day"
    assert shape.char_offset == len(base) + len("Current time: ")
