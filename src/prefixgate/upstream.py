"""Upstream access behind one small interface: a pooled HTTP client with connect,
first-byte and idle timeouts, and every foreign error mapped once into the error tree."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

import httpx
import msgspec

from prefixgate.config import Timeouts
from prefixgate.errors import (
    GatewayError,
    InvalidRequest,
    Overloaded,
    PromptTooLong,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamTimeout,
)

_MAX_ERROR_BODY = 64 * 1024

# Context-window errors as vLLM and SGLang word them.
_MAXIMUM = re.compile(
    r"maximum context length (?:is|of) (\d+)|context length \((\d+) tokens\)"
    r"|max_model_len=(\d+)"
)
_PROMPT = re.compile(
    r"(\d+) in the messages|request has (\d+) input tokens|input \((\d+) tokens\)"
    r"|(\d+) tokens from the input messages|prompt contains at least (\d+) input tokens"
)
# vLLM 0.32: "max_tokens=32000 cannot be greater than max_model_len=16384" (prompt unknown).
_MAX_TOKENS_OVER = re.compile(r"max_tokens=(\d+) cannot be greater than max_model_len=(\d+)")
_REQUESTED = re.compile(r"you requested (\d+) tokens|requested a total of (\d+) tokens")


def _first_int(m: re.Match | None) -> int | None:
    if m is None:
        return None
    return next(int(g) for g in m.groups() if g is not None)


@dataclass(slots=True)
class ContextOverflow:
    """What an upstream said about its context window."""

    maximum: int
    prompt: int  # input tokens (the total requested when the upstream gives no split)

    @property
    def prompt_fits(self) -> bool:
        """The prompt itself fits: only ``max_tokens`` pushed the request over."""
        return self.prompt < self.maximum

    @property
    def max_tokens_room(self) -> int:
        """The largest ``max_tokens`` the upstream will take for this prompt."""
        return self.maximum - self.prompt


def parse_context_error(message: str) -> ContextOverflow | None:
    m = _MAX_TOKENS_OVER.search(message)
    if m:  # only max_tokens is over; the upstream stops generating at the window itself
        return ContextOverflow(int(m.group(2)), 0)
    maximum = _first_int(_MAXIMUM.search(message))
    if maximum is None:
        return None
    prompt = _first_int(_PROMPT.search(message))
    if prompt is None:
        prompt = _first_int(_REQUESTED.search(message))
    if prompt is None:
        return None
    return ContextOverflow(maximum, prompt)


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


def _retry_after(resp: httpx.Response) -> float | None:
    v = resp.headers.get("retry-after")
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


def map_status(status: int, body: bytes, resp: httpx.Response | None = None) -> GatewayError:
    msg = error_message(body)
    retry_after = _retry_after(resp) if resp is not None else None
    if status in (400, 413, 422):
        overflow = parse_context_error(msg)
        if overflow is not None and not overflow.prompt_fits:
            return PromptTooLong(overflow.prompt, overflow.maximum, raw=msg)
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
    if status == 404:
        return UpstreamError(
            f"upstream has no such route or model ({status}): {msg}", upstream_status=status
        )
    return UpstreamError(
        f"upstream error ({status}): {msg}", upstream_status=status, retryable=False
    )


class UpstreamRejected(InvalidRequest):
    """The upstream answered 4xx for the request itself. ``overflow`` is set when the
    prompt fits the context window but prompt + ``max_tokens`` does not."""

    def __init__(self, message: str, *, overflow: ContextOverflow | None = None) -> None:
        super().__init__(message)
        self.overflow = overflow


class UpstreamResponse:
    """An open upstream response (status 2xx). Read it with :meth:`next`."""

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self._it = resp.aiter_bytes().__aiter__()
        self.status = resp.status_code
        self.headers = resp.headers

    async def next(self, timeout: float, *, first: bool = False) -> bytes | None:
        """The next body chunk, or ``None`` at the end. Raises :class:`UpstreamTimeout`
        when nothing arrives within ``timeout`` seconds."""
        while True:
            try:
                chunk = await asyncio.wait_for(self._it.__anext__(), timeout)
            except StopAsyncIteration:
                return None
            except TimeoutError:
                where = "before the first byte" if first else "mid-response"
                raise UpstreamTimeout(f"upstream sent nothing for {timeout:g} s {where}") from None
            except httpx.HTTPError as exc:
                raise UpstreamError(
                    f"upstream connection failed mid-response: {type(exc).__name__}"
                ) from exc
            if chunk:
                return chunk

    async def aclose(self) -> None:
        await self._resp.aclose()


class Upstream:
    """One pooled HTTP client shared by all channels."""

    def __init__(self, *, max_connections: int = 1000) -> None:
        # Idle connections are reused for 4 s only: servers such as vLLM (uvicorn) close
        # theirs after 5 s, and a request sent on a closing connection fails spuriously.
        self._client = httpx.AsyncClient(
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=200, keepalive_expiry=4.0
            ),
            timeout=None,
            follow_redirects=False,
            trust_env=False,
        )

    async def open(
        self, url: str, body: bytes, *, timeouts: Timeouts, extra_headers: dict | None = None
    ) -> UpstreamResponse:
        headers = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "accept-encoding": "identity",
        }
        if extra_headers:
            headers.update(extra_headers)
        req = self._client.build_request(
            "POST",
            url,
            content=body,
            headers=headers,
            timeout=httpx.Timeout(
                connect=timeouts.connect,
                read=timeouts.idle,
                write=timeouts.idle,
                pool=timeouts.connect,
            ),
        )
        try:
            resp = await asyncio.wait_for(self._client.send(req, stream=True), timeouts.first_byte)
        except TimeoutError:
            raise UpstreamTimeout(
                f"upstream did not answer within {timeouts.first_byte:g} s"
            ) from None
        except httpx.ConnectTimeout:
            raise UpstreamTimeout(
                f"upstream connect timed out after {timeouts.connect:g} s"
            ) from None
        except httpx.TimeoutException:
            raise UpstreamTimeout("upstream timed out before the first byte") from None
        except httpx.HTTPError as exc:
            raise UpstreamError(f"cannot reach upstream: {type(exc).__name__}") from exc
        if resp.status_code >= 300:
            try:
                data = await asyncio.wait_for(_read_limited(resp), timeouts.idle)
            except (TimeoutError, httpx.HTTPError):
                data = b""
            finally:
                await resp.aclose()
            raise map_status(resp.status_code, _scrub(data, headers), resp)
        return UpstreamResponse(resp)

    async def get(self, url: str, *, timeout: float = 5.0) -> httpx.Response:
        return await self._client.get(url, timeout=timeout)

    async def aclose(self) -> None:
        await self._client.aclose()


def _scrub(data: bytes, headers: dict) -> bytes:
    """An upstream may echo our credentials in an error; they must never reach the client."""
    for name in ("authorization", "x-api-key"):
        value = headers.get(name)
        if value:
            secret = value.split(" ", 1)[-1].encode()
            if len(secret) >= 8:
                data = data.replace(secret, b"<redacted>")
    return data


async def _read_limited(resp: httpx.Response) -> bytes:
    out = bytearray()
    async for chunk in resp.aiter_bytes():
        out += chunk
        if len(out) > _MAX_ERROR_BODY:
            break
    return bytes(out)
