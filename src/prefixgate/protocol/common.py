"""Checks shared by both protocols: JSON decoding with size and depth limits."""

from __future__ import annotations

import msgspec

from prefixgate.config import Limits
from prefixgate.errors import InvalidRequest, RequestTooLarge
from prefixgate.protocol.validate import check_text, not_json

_decoder = msgspec.json.Decoder()


def check_body_bytes(raw: bytes, limits: Limits) -> None:
    check_body_size(raw, limits)
    check_text(raw)


def check_body_size(raw: bytes, limits: Limits) -> None:
    """:func:`check_body_bytes` but for the text's encoding (for a caller that checks the
    bytes it reads itself: ``messages_body``'s lent decode)."""
    if len(raw) > limits.max_body_bytes:
        raise RequestTooLarge(
            f"request body is {len(raw)} bytes; the limit is {limits.max_body_bytes} bytes"
        )
    if not raw or raw.isspace():
        raise InvalidRequest("request body is empty; a JSON object is required")


def too_deep(limits: Limits) -> InvalidRequest:
    return InvalidRequest(f"request JSON is nested deeper than {limits.max_json_depth} levels")


def decode_body(raw: bytes, limits: Limits) -> dict:
    check_body_bytes(raw, limits)
    try:
        body = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise not_json(raw, exc) from None
    except RecursionError:
        raise too_deep(limits) from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    if json_depth(body, limits.max_json_depth) > limits.max_json_depth:
        raise too_deep(limits)
    return body


def json_depth(obj: object, limit: int) -> int:
    """Nesting depth of a decoded JSON value, level by level; stops counting past
    ``limit``. (Decoded JSON holds plain dicts and lists only, so exact type tests do.)"""
    depth = 0
    level = [obj] if type(obj) in _CONTAINERS else []
    while level:
        depth += 1
        if depth > limit:
            return depth
        nxt: list = []
        add = nxt.append
        for node in level:
            for v in node.values() if type(node) is dict else node:
                if type(v) in _CONTAINERS:
                    add(v)
        level = nxt
    return depth if depth else 1


_CONTAINERS = frozenset((dict, list))


def type_name(v: object) -> str:
    return {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
        type(None): "null",
    }.get(type(v), type(v).__name__)
