"""Plain data of the benchmark: what to send (:class:`RequestSpec`), what came back
(:class:`RequestResult`), and where to send it (:class:`Target`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["API", "RequestResult", "RequestSpec", "Target"]

API = Literal["openai", "anthropic", "responses"]


@dataclass(frozen=True)
class Target:
    """One serving configuration. ``url`` is the API base: ``http://host:8000/v1`` for an
    OpenAI-style server (Chat Completions or Responses), ``http://host:8787`` (or
    ``.../v1``) for Anthropic Messages.
    ``metrics_url`` None: derived (``<url without /v1>/metrics``); "" disables scraping."""

    name: str
    url: str
    api: API = "openai"
    metrics_url: str | None = None

    def endpoint(self) -> str:
        base = self.url.rstrip("/")
        if self.api == "openai":
            return base + "/chat/completions"
        if self.api == "responses":
            return base + ("/responses" if base.endswith("/v1") else "/v1/responses")
        return base + ("/messages" if base.endswith("/v1") else "/v1/messages")

    def models_url(self) -> str:
        base = self.url.rstrip("/")
        return base + "/models" if base.endswith("/v1") else base + "/v1/models"

    def scrape_url(self) -> str | None:
        if self.metrics_url is not None:
            return self.metrics_url or None
        base = self.url.rstrip("/")
        base = base.removesuffix("/v1")
        return base + "/metrics"


@dataclass(frozen=True)
class RequestSpec:
    """One chat request in API-neutral form. ``messages`` are ``{"role", "content"}``
    dicts with string content (roles system, user, assistant); a leading system message
    becomes Anthropic's ``system``. ``label`` names the request within its scenario
    (``cold``, ``warm``, ``turn3``, ...)."""

    messages: tuple[dict[str, str], ...]
    max_tokens: int
    thinking: bool = False
    label: str = ""
    session: int = 0
    turn: int = 0


@dataclass
class RequestResult:
    """The client-side timeline of one streamed request (seconds, ``time.perf_counter``).

    ``ttft``: first event with a non-empty ``choices`` list (OpenAI) or the first
    ``content_block_delta`` (Anthropic), minus ``start``; ``ttft_visible``: the same for the
    first non-reasoning output (None when there was none); ``latency`` (E2EL): last event
    minus ``start``; ``itl``: every gap between successive chunks. Token counts come from
    the server's usage: ``input_tokens`` is the whole prompt (cached part included, OpenAI
    semantics, also for Anthropic), ``cached_tokens`` the cache hit."""

    label: str = ""
    session: int = 0
    turn: int = 0
    max_tokens: int = 0
    success: bool = False
    error: str = ""
    status: int = 0
    start: float = 0.0
    ttft: float = 0.0
    ttft_visible: float | None = None
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    usage_seen: bool = False
    chunks: int = 0
    text: str = ""
    reasoning_chars: int = 0
    finish_reason: str | None = None

    def tpot(self) -> float | None:
        """(latency - ttft) / (output_tokens - 1); None for failed or 1-token requests."""
        if not self.success or self.output_tokens <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    def row(self) -> dict[str, Any]:
        """The per-request record written to results.json (milliseconds)."""
        tpot = self.tpot()
        return {
            "label": self.label,
            "session": self.session,
            "turn": self.turn,
            "success": self.success,
            "error": self.error or None,
            "ttft_ms": self.ttft * 1000 if self.success else None,
            "ttft_visible_ms": None if self.ttft_visible is None else self.ttft_visible * 1000,
            "tpot_ms": None if tpot is None else tpot * 1000,
            "e2el_ms": self.latency * 1000 if self.success else None,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "max_tokens": self.max_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason,
        }
