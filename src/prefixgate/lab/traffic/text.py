"""Seeded building blocks: stable seeds and ids, compact JSON, and the prose, code and
log pools that fill descriptions, tool inputs and tool results."""

from __future__ import annotations

import hashlib
import json
import math
import random
import uuid
from collections.abc import Iterator, Sequence
from functools import lru_cache

_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def dumps(obj: object) -> str:
    """Compact JSON the way a JS client serializes it (no spaces, raw non-ASCII)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def json_len(text: str) -> int:
    """Length of ``text`` once JSON-escaped, without the quotes."""
    return len(json.dumps(text, ensure_ascii=False)) - 2


def derive(*parts: object) -> int:
    """A 64-bit seed from any parts, stable across processes."""
    raw = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "big")


def uuid4(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def hex_digits(rng: random.Random, n: int) -> str:
    return f"{rng.getrandbits(4 * n):0{n}x}"


def b62(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_B62) for _ in range(n))


def loguniform(rng: random.Random, lo: int, hi: int) -> int:
    lo = max(1, lo)
    if hi <= lo:
        return lo
    return int(lo * math.exp(rng.random() * math.log(hi / lo)))


# --------------------------------------------------------------------------- prose


_OPENERS = (
    "Before calling {t}",
    "When {t} runs against a large repository",
    "If an earlier call to {t} failed",
    "In most cases",
    "For long-running work",
    "When the user has asked for one specific change",
    "While exploring code you have not seen before",
    "After a command finishes",
    "If several independent lookups are needed",
    "When the output comes back truncated",
    "For files outside the working directory",
    "Whenever a path could be ambiguous",
    "When a test fails unexpectedly",
    "If the user interrupts or rejects a step",
    "Once the change is in place",
    "When two approaches look equally good",
    "Before you report that the task is complete",
    "If the request mentions a ticket or an issue",
    "When the project has its own conventions",
    "If the working tree has uncommitted changes",
)
_MIDDLES = (
    "check that the target exists and is the one the user meant",
    "prefer the narrowest query that answers the question",
    "send independent calls together in a single response",
    "quote paths that contain spaces or shell metacharacters",
    "read the surrounding code before changing any of it",
    "keep the output short enough to stay useful",
    "report the exact error text rather than a guess at its cause",
    "reuse the helpers that already exist instead of adding new ones",
    "run the narrowest test that covers the change",
    "state the assumption you are making in one short sentence",
    "look for an existing example of the same pattern in the codebase",
    "avoid touching files that are unrelated to the request",
    "prefer absolute paths over relative ones",
    "keep a running list of what is left to do",
    "confirm the result with a quick check of your own",
    "mention any follow-up work that you deliberately left out",
    "match the formatting and naming already used in the file",
    "stop and ask when the instructions contradict each other",
)
_TAILS = (
    "so the user can follow what happened.",
    "because a retry with the same input rarely succeeds.",
    "which keeps the context window small.",
    "to avoid surprising side effects.",
    "unless the user explicitly asked for something else.",
    "since the user may be reviewing each step as it happens.",
    "so that the next step starts from verified facts.",
    "because the repository may be shared with other people.",
    "and say so plainly when something could not be done.",
    "which makes the final summary easier to write.",
    "so that reviewers see one coherent change.",
    "to keep the history of the project readable.",
)
HEADINGS = (
    "Tone and style",
    "Doing tasks",
    "Using tools",
    "Following conventions",
    "Code references",
    "Task management",
    "Asking questions",
    "Safety",
    "Working with version control",
    "Verification",
)


def sentence(rng: random.Random, subject: str) -> str:
    return (
        rng.choice(_OPENERS).format(t=subject)
        + ", "
        + rng.choice(_MIDDLES)
        + " "
        + rng.choice(_TAILS)
    )


def prose(rng: random.Random, n_chars: int, subject: str = "a tool") -> str:
    out: list[str] = []
    size = 0
    while size < n_chars:
        s = sentence(rng, subject)
        out.append(s)
        size += len(s) + 1
    return " ".join(out)


def pieces(rng: random.Random, subject: str) -> Iterator[str]:
    """Endless description text: paragraphs, sometimes a heading or a bullet list."""
    while True:
        style = rng.random()
        if style < 0.2:
            yield f"\n\n## {rng.choice(HEADINGS)}"
            for _ in range(rng.randint(2, 4)):
                yield "\n- " + sentence(rng, subject)
        else:
            yield "\n\n" + sentence(rng, subject)
            for _ in range(rng.randint(1, 4)):
                yield " " + sentence(rng, subject)


# --------------------------------------------------------------------------- content pools

NOUNS = (
    "request", "cache", "prefix", "block", "session", "token", "record", "channel",
    "replica", "upstream", "header", "payload", "stream", "chunk", "batch", "config",
    "route", "key", "usage", "window", "segment", "buffer", "client", "event", "metric",
)  # fmt: skip
VERBS = (
    "get", "load", "build", "parse", "render", "flush", "merge", "split", "hash", "check",
    "emit", "apply", "resolve", "fetch", "encode", "decode", "strip", "count", "update",
    "reset",
)  # fmt: skip
_CLASS_SUFFIX = ("Manager", "Store", "Error", "Parser", "Client", "Config", "State", "Pool")
_COMMENTS = (
    "keep the order stable: callers hash this",
    "TODO: drop once every client sends the new field",
    "fast path for the common case",
    "the upstream may omit this on errors",
    "see the note in the module docstring",
    "never block the event loop here",
)


def ident(rng: random.Random) -> tuple[str, str, str]:
    n = rng.choice(NOUNS)
    return n, f"{rng.choice(VERBS)}_{n}", n.capitalize() + rng.choice(_CLASS_SUFFIX)


@lru_cache(maxsize=4)
def code_pool(lang: str, n_lines: int = 3000) -> tuple[str, ...]:
    rng = random.Random(derive("code", lang))
    lines: list[str] = []
    while len(lines) < n_lines:
        n, f, c = ident(rng)
        m = rng.choice(NOUNS)
        if lang == "py":
            block = [
                f"class {c}:" if rng.random() < 0.15 else "",
                f"    def {f}(self, {m}: {c} | None = None) -> {c}:",
                f'        """{f.replace("_", " ").capitalize()} for the given {m}."""',
                f"        {n} = self._{m}s.get({m})",
                f"        if {n} is None:",
                f'            raise {n.capitalize()}Error(f"no {n} for {{{m}!r}}")',
                f"        # {rng.choice(_COMMENTS)}",
                f"        for item in {n}.{rng.choice(NOUNS)}s:",
                f"            self.{rng.choice(VERBS)}_{rng.choice(NOUNS)}(item, {m})",
                f"        return {n}",
                "",
            ]
        else:
            block = [
                f"export class {c} {{" if rng.random() < 0.15 else "",
                f"  async {f.replace('_', '')}({m}: {c}): Promise<{c}> {{",
                f"    const {n} = this.{m}s.get({m}.id);",
                f"    if (!{n}) throw new Error(`no {n} for ${{{m}.id}}`);",
                f"    // {rng.choice(_COMMENTS)}",
                f"    for (const item of {n}.{rng.choice(NOUNS)}s) {{",
                f"      await this.{rng.choice(VERBS)}{rng.choice(NOUNS).capitalize()}(item);",
                "    }",
                f"    return {n};",
                "  }",
                "",
            ]
        lines.extend(x for x in block if x or rng.random() < 0.8)
    return tuple(lines)


@lru_cache(maxsize=4)
def log_pool(n_lines: int = 2000) -> tuple[str, ...]:
    rng = random.Random(derive("logs"))
    out: list[str] = []
    for _ in range(n_lines):
        r = rng.random()
        _, f, c = ident(rng)
        mod = rng.choice(NOUNS)
        if r < 0.45:
            out.append(
                f"tests/test_{mod}.py::test_{f} PASSED{' ' * rng.randint(1, 20)}[{rng.randint(1, 99):3d}%]"
            )
        elif r < 0.55:
            out.append(f"tests/test_{mod}.py::test_{f} FAILED")
        elif r < 0.7:
            out.append(f'  File "src/app/{mod}.py", line {rng.randint(10, 900)}, in {f}')
        elif r < 0.85:
            out.append(f"INFO  {mod}: {f.replace('_', ' ')} took {rng.randint(1, 999)}ms")
        else:
            out.append(f"E   {c}Error: unexpected {rng.choice(NOUNS)} {rng.randint(0, 4096)}")
    return tuple(out)


def take(pool: Sequence[str], rng: random.Random, n_chars: int) -> list[str]:
    start = rng.randrange(len(pool))
    out: list[str] = []
    size = 0
    i = start
    while size < n_chars:
        line = pool[i % len(pool)]
        out.append(line)
        size += len(line) + 1
        i += 1
    return out
