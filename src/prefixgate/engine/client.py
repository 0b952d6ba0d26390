"""The upstream hop as the engines speak it: :class:`EngineClient` wraps an HTTP
transport (:class:`~prefixgate.upstream.client.Upstream`, or the fake) and reads a status
other than 2xx (:class:`~prefixgate.upstream.client.UpstreamStatus`) as vLLM and SGLang
word it, into the error tree (:func:`map_status`): a prompt over the context window, a
model the engine does not serve, a rate limit, an overload."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from prefixgate.engine.counting import counted, estimate_prompt_tokens
from prefixgate.engine.errors import NO_SUCH_MODEL, ContextOverflow, parse_context_error
from prefixgate.errors import (
    GatewayError,
    InvalidRequest,
    NotFound,
    Overloaded,
    PromptTooLong,
    UpstreamError,
    UpstreamRateLimited,
)
from prefixgate.upstream.client import UpstreamStatus

if TYPE_CHECKING:
    from prefixgate.config import TLSConfig
    from prefixgate.upstream.client import Upstream, UpstreamResponse


def error_message(body: bytes) -> str:
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body[:500].decode("utf-8", "replace").strip() or "upstream error"
    if isinstance(doc, dict):
        err = doc.get("error", doc)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
        if isinstance(doc.get("message"), str):
            return doc["message"]
    return "upstream error"


def _retry_after(resp) -> float | None:
    v = resp.headers.get("retry-after")
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


class UpstreamRejected(InvalidRequest):
    """The upstream answered 4xx for the request itself. ``overflow`` is set when the
    prompt fits the context window but prompt + ``max_tokens`` does not."""

    def __init__(self, message: str, *, overflow: ContextOverflow | None = None) -> None:
        super().__init__(message)
        self.overflow = overflow


def map_status(
    status: int, body: bytes, resp=None, *, request: bytes | None = None
) -> GatewayError:
    """The error of an upstream status; ``resp`` (anything with ``headers``) gives the
    Retry-After. ``request``: the body that was sent, to count a prompt the upstream
    refused without counting it whole."""
    msg = error_message(body)
    retry_after = _retry_after(resp) if resp is not None else None
    if status in (400, 413, 422):
        overflow = parse_context_error(msg)
        if overflow is not None and not overflow.prompt_fits:
            if overflow.at_least and request is not None:
                estimate = estimate_prompt_tokens(request)
                if estimate is not None and estimate > overflow.prompt:
                    return PromptTooLong(
                        estimate, overflow.maximum, raw=msg, estimated_from=overflow.prompt
                    )
            return PromptTooLong(
                overflow.prompt, overflow.maximum, raw=msg, at_least=overflow.at_least
            )
        return UpstreamRejected(f"upstream rejected the request: {msg}", overflow=overflow)
    if status == 429:
        return UpstreamRateLimited(
            f"upstream rate limit: {msg}", upstream_status=429, retry_after=retry_after
        )
    if status == 503 or status == 529:
        return Overloaded(
            f"upstream unavailable ({status}): {msg}",
            upstream_status=status,
            retry_after=retry_after,
        )
    if status >= 500:
        return UpstreamError(f"upstream error ({status}): {msg}", upstream_status=status)
    if status in (401, 403):
        # Our upstream credentials are wrong: not the client's fault; another channel may work.
        return UpstreamError(
            f"upstream refused the gateway's credentials ({status})", upstream_status=status
        )
    if status == 404 and NO_SUCH_MODEL.search(msg):
        # The request named a model the upstream does not serve: the client's error (as
        # Anthropic answers it), never retried elsewhere nor held against the replica.
        return NotFound(f"upstream has no such model: {msg}")
    if status == 404:  # a route the upstream lacks: the channel's URL is wrong
        return UpstreamError(
            f"upstream has no such route or model ({status}): {msg}", upstream_status=status
        )
    return UpstreamError(
        f"upstream error ({status}): {msg}", upstream_status=status, retryable=False
    )


def read_status(err: UpstreamStatus, request: bytes | None = None) -> GatewayError:
    """An upstream's non-2xx answer as the error it means."""
    status = err.upstream_status
    assert status is not None
    return map_status(status, err.body, err, request=request)


class EngineClient:
    """A :class:`~prefixgate.upstream.transport.Transport` whose errors say what the
    engine meant: ``http``'s answers (an :class:`Upstream`, or a test's fake transport), a non-2xx one read by :func:`map_status` (and a
    refused prompt the engine gave only a bound for counted, :mod:`.counting`).
    ``limit`` and ``retire`` go to ``http`` (when it has them: a test's fake has not)."""

    __slots__ = ("http",)

    def __init__(self, http: Upstream) -> None:
        self.http = http

    async def open(self, url: str, body: bytes, **options: Any) -> UpstreamResponse:
        """``http.open(url, body, **options)`` (``timeouts``, ``extra_headers``, ``tls``,
        ``channel``: :meth:`~prefixgate.upstream.transport.Transport.open`)."""
        try:
            return await self.http.open(url, body, **options)
        except UpstreamStatus as status:
            err = read_status(status, body)
        if isinstance(err, PromptTooLong) and err.estimated_from is not None:
            err = await counted(self, err, url, body, options)
        raise err

    async def get_json(self, url: str, **options: Any) -> object:
        """``http.get_json(url, **options)``, a status other than 2xx read."""
        try:
            return await self.http.get_json(url, **options)
        except UpstreamStatus as status:
            raise read_status(status) from None

    async def probe(self, url: str, *, timeout: float, tls: TLSConfig | None = None) -> int:
        return await self.http.probe(url, timeout=timeout, tls=tls)

    def limit(self, url: str, **kwargs) -> None:
        limit = getattr(self.http, "limit", None)
        if limit is not None:
            limit(url, **kwargs)

    def retire(self, url: str, *, channel: str | None = None) -> int:
        retire = getattr(self.http, "retire", None)
        return retire(url, channel=channel) if retire is not None else 0

    async def aclose(self) -> None:
        await self.http.aclose()
