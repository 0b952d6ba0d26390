"""What vLLM and SGLang say when they refuse a request, read: the context-window error
texts (how big the window is, how long the prompt was) and the unknown-model text.

The upstream client (:mod:`prefixgate.upstream.client`) moves the bytes; what the
engine's words mean is here, read into the error tree by :mod:`.client`; the counts behind
a refused prompt are :mod:`.counting`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Context-window errors as vLLM and SGLang word them.
# SGLang also refuses a prompt its KV cache cannot hold: "Input length (N tokens) exceeds
# the maximum allowed length (M tokens)".
_MAXIMUM = re.compile(
    r"maximum context length (?:is|of) (\d+)|context length \((\d+) tokens\)"
    r"|max_model_len=(\d+)|maximum allowed length \((\d+) tokens\)"
)
_PROMPT = re.compile(
    r"(\d+) in the messages|request has (\d+) input tokens|input \((\d+) tokens\)"
    r"|(\d+) tokens from the input messages|prompt contains at least (\d+) input tokens"
    r"|Input length \((\d+) tokens\)"
)
# Only max_tokens is over the window (the prompt not counted): vLLM 0.32 "max_tokens=32000
# cannot be greater than max_model_len=16384"; SGLang "max_completion_tokens is too large:
# 32000.This model supports at most 16384 completion tokens."
_MAX_TOKENS_OVER = re.compile(
    r"max_tokens=\d+ cannot be greater than max_model_len=(\d+)"
    r"|max_completion_tokens is too large: \d+\.\s*This model supports at most (\d+)"
)
_REQUESTED = re.compile(r"you requested (\d+) tokens|requested a total of (\d+) tokens")


# vLLM: "The model `x` does not exist."; SGLang and others: "model ... not found".
NO_SUCH_MODEL = re.compile(r"\bmodel\b.*\b(does not exist|not found|unknown)", re.I | re.S)


def _first_int(m: re.Match | None) -> int | None:
    if m is None:
        return None
    return next(int(g) for g in m.groups() if g is not None)


@dataclass(slots=True)
class ContextOverflow:
    """What an upstream said about its context window."""

    maximum: int
    prompt: int  # input tokens (the total requested when the upstream gives no split)
    at_least: bool = False  # ``prompt`` is a lower bound: the upstream stopped counting

    @property
    def prompt_fits(self) -> bool:
        """The prompt itself fits: only ``max_tokens`` pushed the request over."""
        return self.prompt < self.maximum

    @property
    def max_tokens_room(self) -> int:
        """The largest ``max_tokens`` the upstream will take for this prompt."""
        return self.maximum - self.prompt


def parse_context_error(message: str) -> ContextOverflow | None:
    window = _first_int(_MAX_TOKENS_OVER.search(message))
    if window is not None:  # only max_tokens is over; the upstream stops at the window itself
        return ContextOverflow(window, 0)
    maximum = _first_int(_MAXIMUM.search(message))
    if maximum is None:
        return None
    found = _PROMPT.search(message)
    prompt = _first_int(found)
    if prompt is None:
        prompt = _first_int(_REQUESTED.search(message))
    if prompt is None:
        return None
    return ContextOverflow(maximum, prompt, "at least" in (found.group(0) if found else ""))
