"""Deterministic output for the simulated upstream: text, reasoning and tool-call arguments.

Everything here is pure (no I/O, no clocks). The generator of one request is seeded by
the settings' seed and a hash of the prompt's token ids, so the same prompt always gets
the same answer, and a different prompt almost surely a different one.

Output is a list of *pieces*, one per output token, so that ``completion_tokens``, the
streamed chunks and the token ids handed to the prefix cache agree. With the approximate
tokenizer a piece is 4 ASCII characters (exactly one approx token); with any other
tokenizer a piece is one word with its leading space.
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator, Sequence
from hashlib import blake2b
from typing import Any

import numpy as np

from prefixgate.cache import ApproxTokenizer, Tokenizer

__all__ = [
    "cut_at_stop",
    "piece_ids",
    "prompt_rng",
    "reasoning_pieces",
    "schema_value",
    "text_pieces",
    "tool_arguments",
]

_WORDS = (
    "the", "cache", "keeps", "every", "block", "of", "the", "prompt", "that", "it", "has",
    "seen", "before", "and", "a", "request", "that", "starts", "with", "the", "same", "tokens",
    "reuses", "them", "so", "the", "model", "only", "computes", "what", "is", "new", "prefix",
    "hits", "save", "time", "on", "long", "conversations", "agents", "tools", "system",
    "prompts", "and", "files", "stay", "stable", "while", "the", "last", "user", "turn",
    "changes", "each", "block", "is", "hashed", "with", "its", "parent", "which", "means",
    "an", "edit", "near", "the", "start", "invalidates", "everything", "after", "it",
)  # fmt: skip
_THOUGHTS = (
    "let", "me", "think", "about", "this", "first", "the", "user", "wants", "a", "short",
    "answer", "I", "should", "check", "the", "context", "again", "consider", "the", "tools",
    "available", "and", "then", "reply", "clearly", "step", "by", "step", "maybe", "there",
    "is", "a", "simpler", "way", "so", "I", "will", "verify", "the", "details", "before",
    "answering",
)  # fmt: skip
_MAX_DEPTH = 8


def prompt_rng(tokens: Sequence[int] | np.ndarray, seed: int = 0, salt: str = "") -> random.Random:
    """A generator keyed on the seed and the prompt's token ids (and an optional salt)."""
    h = blake2b(digest_size=16)
    h.update(f"prefixgate/sim/{seed}/{salt}\0".encode())
    h.update(np.asarray(tokens, dtype="<i8").tobytes())
    return random.Random(int.from_bytes(h.digest(), "little"))


def _word_stream(rng: random.Random, words: Sequence[str]) -> Iterator[str]:
    first = True
    while True:
        word = rng.choice(words)
        if first:
            word = word.capitalize()
        first = False
        if rng.random() < 0.08:
            word += "."
            yield word
            first = True
            continue
        yield word


def _pieces(rng: random.Random, n: int, words: Sequence[str], tokenizer: Tokenizer) -> list[str]:
    if n <= 0:
        return []
    stream = _word_stream(rng, words)
    if isinstance(tokenizer, ApproxTokenizer):
        parts: list[str] = []
        size = 0
        while size < 4 * n:
            w = next(stream)
            parts.append(w)
            size += len(w) + (1 if len(parts) > 1 else 0)
        text = " ".join(parts)[: 4 * n]
        return [text[i : i + 4] for i in range(0, 4 * n, 4)]
    out = [next(stream) for _ in range(n)]
    return [out[0]] + [" " + w for w in out[1:]]


def text_pieces(rng: random.Random, n: int, tokenizer: Tokenizer) -> list[str]:
    """``n`` pieces of answer text (one per output token)."""
    return _pieces(rng, n, _WORDS, tokenizer)


def reasoning_pieces(rng: random.Random, n: int, tokenizer: Tokenizer) -> list[str]:
    """``n`` pieces of reasoning text (``reasoning_content``)."""
    return _pieces(rng, n, _THOUGHTS, tokenizer)


def piece_ids(pieces: Sequence[str], tokenizer: Tokenizer) -> list[int]:
    """One token id per piece: the piece's first token, or a synthetic id for a piece that
    tokenizes to nothing."""
    ids: list[int] = []
    for p in pieces:
        enc = tokenizer.encode(p)
        if enc:
            ids.append(int(enc[0]))
        else:
            ids.append(int.from_bytes(blake2b(p.encode(), digest_size=4).digest(), "little"))
    return ids


def cut_at_stop(
    pieces: Sequence[str], stops: Sequence[str], *, include_stop: bool = False
) -> tuple[list[str], str | None]:
    """Cut the text at the earliest stop string.

    Returns the pieces up to and including the one where the stop string ends (so their
    count is the tokens generated), the last one trimmed so that the joined text ends just
    before the stop string (or just after it with ``include_stop``), and the matched string
    (``None`` if no stop string occurs).
    """
    text = "".join(pieces)
    best: tuple[int, str] | None = None
    for s in stops:
        if not s:
            continue
        at = text.find(s)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, s)
    if best is None:
        return list(pieces), None
    at, stop = best
    keep = at + len(stop) if include_stop else at
    end = at + len(stop)
    out: list[str] = []
    pos = 0
    for p in pieces:
        if pos >= end:
            break
        out.append(p[: max(0, keep - pos)])
        pos += len(p)
    return out, stop


# -- JSON schema -> a conforming value ---------------------------------------------------


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    seen = 0
    while isinstance(ref, str) and ref.startswith("#") and seen < _MAX_DEPTH:
        node: Any = root
        for part in ref.lstrip("#").strip("/").split("/"):
            if not part:
                continue
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return {}
        schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
        ref = node.get("$ref")
        seen += 1
    return schema


def _schema_type(schema: dict[str, Any]) -> str:
    t = schema.get("type")
    if isinstance(t, list):
        non_null = [x for x in t if x != "null"]
        t = non_null[0] if non_null else "null"
    if isinstance(t, str):
        return t
    if "properties" in schema or "required" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return "string"


def _string(schema: dict[str, Any], rng: random.Random) -> str:
    fmt = schema.get("format")
    if fmt == "date-time":
        value = f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T12:00:00Z"
    elif fmt == "date":
        value = f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    elif fmt == "email":
        value = f"{rng.choice(_WORDS)}@example.com"
    elif fmt in ("uri", "url"):
        value = f"https://example.com/{rng.choice(_WORDS)}"
    elif fmt == "uuid":
        h = f"{rng.getrandbits(128):032x}"
        value = f"{h[:8]}-{h[8:12]}-4{h[13:16]}-8{h[17:20]}-{h[20:]}"
    else:
        value = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))
    lo = schema.get("minLength")
    hi = schema.get("maxLength")
    if isinstance(lo, int) and len(value) < lo:
        value += "".join(rng.choice(string.ascii_lowercase) for _ in range(lo - len(value)))
    if isinstance(hi, int) and hi >= 0 and len(value) > hi:
        value = value[:hi]
    return value


def _bounds(schema: dict[str, Any], integer: bool) -> tuple[float, float]:
    lo = schema.get("minimum")
    hi = schema.get("maximum")
    step = 1 if integer else 0.01
    ex_lo = schema.get("exclusiveMinimum")
    ex_hi = schema.get("exclusiveMaximum")
    if isinstance(ex_lo, int | float) and not isinstance(ex_lo, bool):
        lo = ex_lo + step if lo is None else max(lo, ex_lo + step)
    if isinstance(ex_hi, int | float) and not isinstance(ex_hi, bool):
        hi = ex_hi - step if hi is None else min(hi, ex_hi - step)
    if lo is None and hi is None:
        lo, hi = 0, 100
    elif lo is None:
        lo = hi - 100
    elif hi is None:
        hi = lo + 100
    return lo, max(lo, hi)


def schema_value(schema: Any, rng: random.Random, root: Any = None, depth: int = 0) -> Any:
    """A deterministic value that conforms to a (practical subset of) JSON schema:
    ``$ref`` (local), ``const``, ``enum``, ``anyOf``/``oneOf`` (first non-null option),
    ``allOf`` (merged), objects (every REQUIRED property), arrays (``minItems`` items, at
    least one), strings (common formats, length bounds), numbers and integers (bounds),
    booleans and null."""
    if not isinstance(schema, dict):
        return {} if depth == 0 else None
    root = schema if root is None else root
    schema = _resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return rng.choice(enum)
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            picked = next(
                (o for o in options if isinstance(o, dict) and o.get("type") != "null"),
                options[0],
            )
            rest = {k: v for k, v in schema.items() if k != key}
            return schema_value({**rest, **picked}, rng, root, depth)
    parts = schema.get("allOf")
    if isinstance(parts, list) and parts:
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for part in parts:
            if isinstance(part, dict):
                part = _resolve(part, root)
                props = {**merged.get("properties", {}), **part.get("properties", {})}
                required = list(merged.get("required", [])) + list(part.get("required", []))
                merged = {**merged, **part, "properties": props, "required": required}
        return schema_value(merged, rng, root, depth)
    kind = _schema_type(schema)
    if depth >= _MAX_DEPTH:
        return {"object": {}, "array": []}.get(kind)
    if kind == "object":
        props = schema.get("properties") or {}
        required = [r for r in schema.get("required") or [] if isinstance(r, str)]
        out: dict[str, Any] = {}
        for name in required:
            sub = props.get(name, {})
            out[name] = schema_value(sub, rng, root, depth + 1)
        return out
    if kind == "array":
        lo = schema.get("minItems")
        hi = schema.get("maxItems")
        n = lo if isinstance(lo, int) and lo > 0 else 1
        if isinstance(hi, int):
            n = min(n, hi)
        items = schema.get("items", {})
        if isinstance(items, list):  # tuple form
            return [schema_value(s, rng, root, depth + 1) for s in items]
        return [schema_value(items, rng, root, depth + 1) for _ in range(n)]
    if kind == "string":
        return _string(schema, rng)
    if kind == "integer":
        lo, hi = _bounds(schema, integer=True)
        return rng.randint(int(-(-lo // 1)), int(hi // 1))
    if kind == "number":
        lo, hi = _bounds(schema, integer=False)
        return round(rng.uniform(lo, hi), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    return None


def tool_arguments(tool: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Arguments for an OpenAI ``{"type":"function","function":{...}}`` tool."""
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    params = fn.get("parameters") if isinstance(fn, dict) else None
    value = schema_value(params if isinstance(params, dict) else {}, rng)
    return value if isinstance(value, dict) else {}
