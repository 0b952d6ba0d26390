"""Usage conversion between OpenAI semantics (upstream) and Anthropic semantics (client),
and into the Responses API's shape (OpenAI semantics, other names).

OpenAI-style upstreams count ``prompt_tokens`` INCLUDING the cached part
(``prompt_tokens_details.cached_tokens``). Anthropic's ``input_tokens`` EXCLUDES cache reads
and writes. A client such as Claude Code sums ``input_tokens + cache_read_input_tokens +
cache_creation_input_tokens + output_tokens`` to learn how full its context is, so counting
the cached part twice makes it compact early. With ``exclude_cache`` off the legacy (wrong)
figure is reported, for clients that want it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Usage:
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None  # of the completion, when the upstream says
    cache_creation_tokens: int | None = None  # reported by Anthropic-style upstreams only

    @classmethod
    def from_openai(cls, usage: object) -> Usage:
        if not isinstance(usage, dict):
            return cls()
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        out = usage.get("completion_tokens_details")
        reasoning = out.get("reasoning_tokens") if isinstance(out, dict) else None
        if reasoning is None:  # SGLang counts them in a top-level ``reasoning_tokens``
            reasoning = usage.get("reasoning_tokens")
        return cls(
            prompt_tokens=_int(usage.get("prompt_tokens")),
            cached_tokens=_int(cached),
            completion_tokens=_int(usage.get("completion_tokens")),
            reasoning_tokens=_int(reasoning),
        )

    def to_anthropic(self, exclude_cache: bool = True) -> dict[str, Any]:
        prompt = self.prompt_tokens or 0
        cached = self.cached_tokens or 0
        return {
            "input_tokens": max(0, prompt - cached) if exclude_cache else prompt,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": self.completion_tokens or 0,
        }

    def to_responses(self) -> dict[str, Any]:
        """The Responses API's usage: OpenAI semantics, as the upstream counted them
        (``input_tokens`` includes the cached part, ``cached_tokens``)."""
        prompt = self.prompt_tokens or 0
        completion = self.completion_tokens or 0
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": self.cached_tokens or 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens or 0},
            "total_tokens": prompt + completion,
        }

    @classmethod
    def from_responses(cls, usage: object) -> Usage:
        """A Responses API usage object (an upstream that serves ``/responses`` itself)."""
        if not isinstance(usage, dict):
            return cls()
        details = usage.get("input_tokens_details")
        out = usage.get("output_tokens_details")
        return cls(
            prompt_tokens=_int(usage.get("input_tokens")),
            cached_tokens=_int(details.get("cached_tokens") if isinstance(details, dict) else None),
            completion_tokens=_int(usage.get("output_tokens")),
            reasoning_tokens=_int(out.get("reasoning_tokens") if isinstance(out, dict) else None),
        )


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def message_start_usage() -> dict[str, Any]:
    """``message_start`` carries no estimate: clients take the larger of the start and end
    figures, so anything above the true uncached count would inflate their context."""
    return {
        "input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 0,
    }
