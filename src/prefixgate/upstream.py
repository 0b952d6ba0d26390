"""Upstream access behind one small interface: a pooled HTTP client with connect,
first-byte and idle timeouts, and every foreign error mapped once into the error tree.

The client is aiohttp: measured against httpx on this project's overhead benchmark
(``docs/performance.md``) it costs 4-14x less CPU a request (httpx's connection pool scans
every connection on each request, through anyio's socket attributes)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

import aiohttp
import msgspec
import yarl

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


def _retry_after(resp) -> float | None:
    v = resp.headers.get("retry-after")
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


def map_status(status: int, body: bytes, resp=None) -> GatewayError:
    """The error of an upstream status; ``resp`` (anything with ``headers``) gives the
    Retry-After."""
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

    __slots__ = ("_resp", "_content", "status", "headers")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self._content = resp.content
        self.status = resp.status
        self.headers = resp.headers

    async def next(self, timeout: float, *, first: bool = False) -> bytes | None:
        """The next body chunk, or ``None`` at the end. Raises :class:`UpstreamTimeout`
        when nothing arrives within ``timeout`` seconds."""
        content = self._content
        try:
            chunk = content.read_nowait()  # what is already buffered: no timer, no wait
            if chunk:
                return chunk
            while not content.at_eof():
                async with asyncio.timeout(timeout):
                    chunk = await content.readany()
                if chunk:
                    return chunk
        except TimeoutError:
            where = "before the first byte" if first else "mid-response"
            raise UpstreamTimeout(f"upstream sent nothing for {timeout:g} s {where}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(
                f"upstream connection failed mid-response: {type(exc).__name__}"
            ) from exc
        return None

    async def aclose(self) -> None:
        """Done with the response: a fully read one gives its connection back to the pool;
        an unfinished one closes it (which cancels the request upstream)."""
        resp = self._resp
        if self._content.at_eof():
            resp.release()
        else:
            resp.close()


class Upstream:
    """One pooled HTTP client (aiohttp) shared by all channels, created on first use in
    the serving event loop."""

    def __init__(self, *, max_connections: int = 1000) -> None:
        self._max = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, yarl.URL] = {}
        self._timeouts: dict[tuple[float, float], aiohttp.ClientTimeout] = {}

    def _client(self) -> aiohttp.ClientSession:
        session = self._session
        if session is None or session.closed:
            # Idle connections are reused for 4 s only: servers such as vLLM (uvicorn) close
            # theirs after 5 s, and a request sent on a closing connection fails spuriously.
            connector = aiohttp.TCPConnector(
                limit=self._max, limit_per_host=0, keepalive_timeout=4.0, ttl_dns_cache=60
            )
            session = self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                trust_env=False,
                timeout=aiohttp.ClientTimeout(total=None),
                skip_auto_headers=("User-Agent",),
            )
        return session

    def _url(self, url: str) -> yarl.URL:
        u = self._urls.get(url)
        if u is None:
            if len(self._urls) > 1024:
                self._urls.clear()
            u = self._urls[url] = yarl.URL(url)
        return u

    def _timeout(self, t: Timeouts) -> aiohttp.ClientTimeout:
        key = (t.connect, t.idle)
        out = self._timeouts.get(key)
        if out is None:
            # connect: waiting for a pooled connection and opening a new one; sock_read:
            # the idle timeout per socket read (the first byte has its own, below).
            out = self._timeouts[key] = aiohttp.ClientTimeout(
                total=None, connect=t.connect, sock_connect=t.connect, sock_read=t.idle
            )
        return out

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
        try:
            async with asyncio.timeout(timeouts.first_byte):
                resp = await self._client().request(
                    "POST",
                    self._url(url),
                    data=body,
                    headers=headers,
                    timeout=self._timeout(timeouts),
                    allow_redirects=False,
                )
        except aiohttp.ConnectionTimeoutError:
            raise UpstreamTimeout(
                f"upstream connect timed out after {timeouts.connect:g} s"
            ) from None
        except aiohttp.ServerTimeoutError:
            raise UpstreamTimeout("upstream timed out before the first byte") from None
        except TimeoutError:
            raise UpstreamTimeout(
                f"upstream did not answer within {timeouts.first_byte:g} s"
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(f"cannot reach upstream: {type(exc).__name__}") from exc
        if resp.status >= 300:
            try:
                async with asyncio.timeout(timeouts.idle):
                    data = await _read_limited(resp)
            except (TimeoutError, aiohttp.ClientError, OSError):
                data = b""
            finally:
                resp.close()
            raise map_status(resp.status, _scrub(data, headers), resp)
        return UpstreamResponse(resp)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _scrub(data: bytes, headers: dict) -> bytes:
    """An upstream may echo our credentials in an error; they must never reach the client."""
    for name in ("authorization", "x-api-key"):
        value = headers.get(name)
        if value:
            secret = value.split(" ", 1)[-1].encode()
            if len(secret) >= 8:
                data = data.replace(secret, b"<redacted>")
    return data


async def _read_limited(resp: aiohttp.ClientResponse) -> bytes:
    out = bytearray()
    async for chunk in resp.content.iter_any():
        out += chunk
        if len(out) > _MAX_ERROR_BODY:
            break
    return bytes(out)
