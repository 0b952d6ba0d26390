"""One error tree for the gateway.

Every foreign error (httpx, JSON decoding, upstream HTTP statuses) is mapped once, at the
boundary where it is caught, into a :class:`GatewayError`. Each error knows its HTTP status
and a protocol-neutral kind; ``protocol/anthropic.py`` and ``protocol/openai.py`` turn it
into the caller's error shape. Messages never contain secrets.
"""

from __future__ import annotations


class GatewayError(Exception):
    """Base class. ``kind`` is one of the neutral kinds below."""

    status = 500
    kind = "api_error"
    code: str | None = None  # OpenAI's ``error.code``, when more precise than the kind's

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(GatewayError):
    status = 400
    kind = "invalid_request_error"


class RequestTooLarge(GatewayError):
    status = 413
    kind = "request_too_large"


class HeadersTooLarge(InvalidRequest):
    status = 431
    code = "headers_too_large"


class PromptTooLong(InvalidRequest):
    """The upstream refused the prompt for its context window (N tokens > M maximum)."""

    code = "context_length_exceeded"

    def __init__(self, prompt_tokens: int, max_tokens: int, raw: str = "") -> None:
        super().__init__(f"prompt is too long: {prompt_tokens} tokens > {max_tokens} maximum")
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.raw = raw


class AuthenticationFailed(GatewayError):
    status = 401
    kind = "authentication_error"


class PermissionDenied(GatewayError):
    status = 403
    kind = "permission_error"


class NotFound(GatewayError):
    status = 404
    kind = "not_found_error"


class Unavailable(GatewayError):
    """The gateway itself cannot take the request now (its connection cap): retry later."""

    status = 503
    kind = "overloaded_error"


class AtCapacity(Unavailable):
    """The gateway (or a channel) carries as many requests as it may, and its queue is full
    or the wait ran out (``admission.py``). Answered 529 on the Anthropic routes, 503 on
    OpenAI's (the endpoint's ``overloaded_status``), with ``retry-after``."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RateLimited(GatewayError):
    status = 429
    kind = "rate_limit_error"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BudgetExceeded(GatewayError):
    """A key's or its owner's budget is spent for its window: 429, as Anthropic's
    ``rate_limit_error`` and OpenAI's ``insufficient_quota``. ``retry_after`` is when the
    window ends; the answer tells SDKs not to retry (``x-should-retry: false``)."""

    status = 429
    kind = "insufficient_quota"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class UpstreamError(GatewayError):
    """The upstream failed. ``retryable`` errors may fail over to another channel when no
    byte has been sent to the client yet."""

    status = 502
    kind = "api_error"
    retryable = True

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool | None = None,
        upstream_status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        if retryable is not None:
            self.retryable = retryable
        self.upstream_status = upstream_status
        self.retry_after = retry_after


class ChannelBusy(UpstreamError):
    """A channel carries as many requests as its ``max_in_flight``: the next target is
    tried (it says nothing about the replica's health)."""

    status = 503
    kind = "overloaded_error"


class UpstreamRateLimited(UpstreamError):
    """The upstream said 429: another target may take it; else the client is told when to
    retry."""

    status = 429
    kind = "rate_limit_error"


class UpstreamTimeout(UpstreamError):
    status = 504
    kind = "timeout_error"


class Overloaded(UpstreamError):
    status = 529
    kind = "overloaded_error"
