"""Seeded prompt text, sized in approximate tokens.

The text is a pure function of ``(seed, n_tokens, salt)``: the same on every machine and in
every process (``random.Random`` seeded from SHA-256, never the salted ``hash()``). Sizes
are approximate: about four characters per token, which is what the simulated upstream's
tokenizer counts exactly and close to what BPE tokenizers give for plain English. The
server's own ``usage.prompt_tokens`` is what the benchmark reports, never this estimate.

A ``salt`` line is put FIRST so that two salts share no prefix at all: the benchmark salts
every prompt with its run id and target name, so a "cold" request is cold even when two
targets share one backend or the benchmark ran before against the same server.
"""

from __future__ import annotations

import hashlib
import random

__all__ = ["CHARS_PER_TOKEN", "seeded_text"]

CHARS_PER_TOKEN = 4

_WORDS_TEXT = (
    "the of and to in is for on that with as by at from this be are was it an or which "
    "system cache token model server request prefix block memory batch queue latency "
    "decode prefill kernel tensor layer weight graph stream client worker budget router "
    "engine sample value index table record window signal buffer thread socket replica "
    "channel metric report result number shape order count split merge write read fetch "
    "store check build parse route serve plan run test send wait keep move hold share "
    "quick slow large small early late first last next other every single simple stable "
    "river mountain garden window silver morning harbor lantern meadow pebble orchard"
)
_WORDS = tuple(_WORDS_TEXT.split())


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def seeded_text(seed: int | str, n_tokens: int, *, salt: str = "") -> str:
    """About ``n_tokens`` tokens of deterministic English-like prose (sentences of common
    words), prefixed by ``salt`` on its own line when given. The salt counts towards the
    size."""
    if n_tokens < 1:
        raise ValueError("n_tokens must be >= 1")
    target = n_tokens * CHARS_PER_TOKEN
    head = f"[{salt}]\n" if salt else ""
    rng = _rng("bench-text", seed)
    parts: list[str] = [head]
    size = len(head)
    while size < target:
        words = rng.choices(_WORDS, k=rng.randint(6, 16))
        sentence = " ".join(words).capitalize() + ". "
        parts.append(sentence)
        size += len(sentence)
    return "".join(parts)[:target].rstrip() or "x"
