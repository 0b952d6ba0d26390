"""Texts as JSON, shared by the conversions to OpenAI Chat (``apis/messages/request.py``,
``apis/responses/request.py``): a text is a ``str`` or a ``msgspec.Raw`` JSON string as the
client wrote it, joined and tested on its JSON without decoding it; and the options every
conversion takes."""

from __future__ import annotations

import json
from dataclasses import dataclass

import msgspec
from msgspec import Raw

_ANY = msgspec.json.Decoder()
_encode = msgspec.json.encode
_CONTAINER_OPENERS = (91, 123)  # '[', '{'


@dataclass(frozen=True, slots=True)
class ConvertOptions:
    upstream_model: str
    thinking: str = "chat_template_kwargs"  # | "reasoning_effort" | "drop"
    history_thinking: str = "reasoning_content"  # | "drop"


def dumps(obj: object) -> str:
    """Canonical compact JSON used for tool-call arguments."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


Text = str | Raw  # a string, or a JSON string as it came


def inner(text: Text):
    """The JSON of a text between its quotes."""
    if type(text) is str:
        return _encode(text)[1:-1]
    return memoryview(text)[1:-1]


def join(texts: list[Text], sep: str) -> Text:
    """``sep.join(texts)``, done on the JSON when a text is raw."""
    if len(texts) == 1:
        return texts[0]
    if all(type(t) is str for t in texts):
        return sep.join(texts)
    return Raw(b'"' + bytes(inner(sep)).join(inner(t) for t in texts) + b'"')


def empty(text: Text) -> bool:
    return text == "" if type(text) is str else len(text) <= 2


def truthy(raw: Raw) -> bool:
    """``bool()`` of a raw JSON value as Python would see it decoded."""
    n = len(raw)
    if n == 0:
        return False
    first = memoryview(raw)[0]
    if first == 34:  # a string
        return n > 2
    if n > 16 and first in _CONTAINER_OPENERS:
        return True  # an object or array this long has something in it
    return bool(_ANY.decode(raw))


def owned(obj):
    """``obj`` (a converted message or tool: dicts, lists, texts) with each raw text a copy
    of its own, no longer a view of the request's bytes."""
    kind = type(obj)
    if kind is Raw:
        return Raw(bytes(obj))
    if kind is dict:
        return {k: owned(v) for k, v in obj.items()}
    if kind is list:
        return [owned(v) for v in obj]
    return obj
