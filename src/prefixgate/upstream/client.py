"""Upstream access behind one small interface: a pooled HTTP client with connect,
first-byte and idle timeouts, and every foreign error mapped once into the error tree (a
status other than 2xx as :class:`UpstreamStatus`: what its body says is the engine's word,
:mod:`prefixgate.engine.client`).

The client is the project's own (``http1``): on the overhead benchmark
(``docs/performance.md``) it costs a fraction of aiohttp's CPU a request, which itself
costs 4-14x less than httpx's."""

from __future__ import annotations

import asyncio
import errno
import ssl

import msgspec

from prefixgate.config import Timeouts, TLSConfig
from prefixgate.errors import UpstreamError, UpstreamTimeout
from prefixgate.upstream import http1

_MAX_ERROR_BODY = 64 * 1024


class UpstreamStatus(UpstreamError):
    """The upstream answered a status other than 2xx: its ``upstream_status``, headers and
    body (up to 64 KB, the request's credentials scrubbed from it). What the body means is
    the engine's word (:mod:`prefixgate.engine.client` reads it into the error tree)."""

    def __init__(self, status: int, headers, body: bytes) -> None:
        super().__init__(f"upstream answered {status}", upstream_status=status)
        self.headers = headers
        self.body = body


def os_error(exc: BaseException) -> str:
    """An OS error named by its errno (``EMFILE: Too many open files``), so an operator can
    tell a full file table from a refused connection."""
    code = getattr(exc, "errno", None)
    if isinstance(exc, OSError) and code is not None:
        return f"{errno.errorcode.get(code, code)}: {exc.strerror or exc}"
    return type(exc).__name__


class UpstreamResponse:
    """An open upstream response (status 2xx). Read it with :meth:`next`."""

    __slots__ = ("_conn", "_pool", "status", "headers", "_released")

    def __init__(self, conn: http1.Connection, pool: http1.Pool) -> None:
        self._conn, self._pool = conn, pool
        self.status = conn.status
        self.headers = conn.headers
        self._released = False

    async def next(self, timeout: float, *, first: bool = False) -> bytes | None:
        """The next body chunk (everything buffered), or ``None`` at the end. Raises
        :class:`UpstreamTimeout` when nothing arrives within ``timeout`` seconds."""
        conn = self._conn
        if conn.chunks:  # already buffered: no timer, no wait
            return conn.take()
        try:
            return await conn.read(timeout)
        except TimeoutError:
            where = "before the first byte" if first else "mid-response"
            raise UpstreamTimeout(f"upstream sent nothing for {timeout:g} s {where}") from None
        except http1.HTTPError as exc:
            raise UpstreamError(f"upstream connection failed mid-response: {exc}") from exc

    def spliceable(self) -> http1.Connection:
        """The connection, for a splice to take the rest of the body from
        (``pipeline/splice.py``); the response is still closed with :meth:`aclose`."""
        return self._conn

    async def aclose(self) -> None:
        """Done with the response: a fully read one gives its connection back to the pool;
        an unfinished one closes it (which cancels the request upstream)."""
        if not self._released:
            self._released = True
            self._pool.release(self._conn)


async def read_all(resp, idle: float) -> bytes:
    """The rest of an open response's body; the response is closed after."""
    chunks = []
    try:
        while (chunk := await resp.next(idle)) is not None:
            chunks.append(chunk)
    finally:
        await resp.aclose()
    return b"".join(chunks)


class Upstream:
    """The HTTP client shared by all channels (``http1``: keep-alive pools per upstream),
    made on first use in the serving event loop. ``max_connections`` open in all;
    :meth:`limit` sets an upstream's own cap and idle keep-alive."""

    def __init__(
        self,
        *,
        max_connections: int = 1000,
        keepalive: float = 4.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._max = max_connections
        # Idle connections are kept 4 s by default: servers such as vLLM (uvicorn) close
        # theirs after 5 s, and a request sent on a closing connection fails spuriously.
        self._keepalive = keepalive
        self._ssl = ssl_context  # None: the system's trusted CAs, hostname checked
        self._pool: http1.Pool | None = None
        self._targets: dict[tuple, tuple[http1.Origin, str]] = {}
        self._contexts: dict[TLSConfig, ssl.SSLContext] = {}
        self._limits: dict[tuple, tuple[int | None, float | None]] = {}

    def limit(
        self,
        url: str,
        *,
        max_connections: int | None,
        keepalive: float | None,
        channel: str | None = None,
    ) -> None:
        """At most ``max_connections`` of ``channel``'s connections open to ``url``'s host
        and port (None: only the overall cap), an idle one kept ``keepalive`` seconds
        (None: the default). Each channel's connections are its own."""
        origin, _ = http1.split_url(url)
        self._limits[(*origin.key[:3], channel)] = (max_connections, keepalive)
        self._targets.clear()

    def retire(self, url: str, *, channel: str | None = None) -> int:
        """``channel`` no longer sends to ``url`` (a reload removed the replica): its
        connection limits are forgotten, its idle connections closed now and those still
        carrying a request closed when it ends. Returns the number closed now."""
        origin, _ = http1.split_url(url)
        self._limits.pop((*origin.key[:3], channel), None)
        self._targets.clear()
        if self._pool is None:
            return 0
        want = origin.key[:3]

        def match(key: tuple) -> bool:
            group = key[-1] if len(key) >= 5 and key[-2] == "group" else None
            return key[:3] == want and group == channel

        return self._pool.retire(match)

    def _pool_of(self, loop: asyncio.AbstractEventLoop) -> http1.Pool:
        pool = self._pool
        if pool is None or pool.loop is not loop:
            pool = self._pool = http1.Pool(
                loop, max_connections=self._max, keepalive=self._keepalive, ssl_context=self._ssl
            )
        return pool

    def _target(
        self, url: str, tls: TLSConfig | None = None, channel: str | None = None
    ) -> tuple[http1.Origin, str]:
        key = (url, tls, channel)
        t = self._targets.get(key)
        if t is None:
            if len(self._targets) > 1024:
                self._targets.clear()
            try:
                t = self._targets[key] = http1.split_url(url, self._context_of(tls), channel)
            except (ValueError, OSError, ssl.SSLError) as exc:
                raise UpstreamError(f"cannot reach upstream: {exc}", retryable=False) from None
            limits = self._limits.get((*t[0].key[:3], channel))
            if limits is not None:
                t[0].limit, t[0].keepalive = limits
        return t

    def _context_of(self, tls: TLSConfig | None) -> ssl.SSLContext | None:
        """One SSL context per distinct channel TLS setting, made once."""
        if tls is None:
            return None
        ctx = self._contexts.get(tls)
        if ctx is None:
            ctx = self._contexts[tls] = tls.context()
        return ctx

    async def open(
        self,
        url: str,
        body: bytes,
        *,
        timeouts: Timeouts,
        extra_headers: dict | None = None,
        tls: TLSConfig | None = None,
        channel: str | None = None,
    ) -> UpstreamResponse:
        origin, path = self._target(url, tls, channel)
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Accept-Encoding": "identity",
        }
        if extra_headers:
            headers.update(extra_headers)
        data = _request_bytes("POST", path, origin, headers, body)
        loop = asyncio.get_running_loop()
        pool = self._pool_of(loop)
        deadline = loop.time() + timeouts.first_byte
        for attempt in (1, 2):
            remaining = deadline - loop.time()
            try:
                conn = await pool.acquire(
                    origin, min(timeouts.connect, remaining), fresh=attempt == 2
                )
            except TimeoutError:
                if remaining <= timeouts.connect:
                    raise UpstreamTimeout(
                        f"upstream did not answer within {timeouts.first_byte:g} s"
                    ) from None
                raise UpstreamTimeout(
                    f"upstream connect timed out after {timeouts.connect:g} s"
                ) from None
            except OSError as exc:
                raise UpstreamError(f"cannot reach upstream: {os_error(exc)}") from exc
            try:
                conn.send(*data)
                await conn.headers_of_response(deadline - loop.time())
            except TimeoutError:
                pool.discard(conn)
                raise UpstreamTimeout(
                    f"upstream did not answer within {timeouts.first_byte:g} s"
                ) from None
            except http1.ConnectionClosed as exc:
                pool.discard(conn)
                # A kept-alive connection the server closed while it sat idle: the request
                # never reached it, so it is sent once more on a new connection.
                if attempt == 1 and conn.reused and exc.before_response:
                    continue
                raise UpstreamError(f"cannot reach upstream: {exc}") from exc
            except http1.HTTPError as exc:
                pool.discard(conn)
                raise UpstreamError(f"upstream answered badly: {exc}") from exc
            except BaseException:
                pool.discard(conn)
                raise
            break
        if conn.status >= 300:
            try:
                body_bytes = await _read_limited(conn, timeouts.idle)
            finally:
                pool.discard(conn)
            raise UpstreamStatus(conn.status, conn.headers, _scrub(body_bytes, headers))
        return UpstreamResponse(conn, pool)

    async def get_json(
        self,
        url: str,
        *,
        timeouts: Timeouts,
        extra_headers: dict | None = None,
        tls: TLSConfig | None = None,
    ) -> object:
        """``GET url`` and its JSON body (a listing such as ``/v1/models``); raises
        :class:`UpstreamError` on any failure or a body that is not JSON,
        :class:`UpstreamStatus` on a status >= 300."""
        headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
        headers.update(extra_headers or {})
        try:
            status, body, conn = await self._get(
                url, headers, timeouts.connect, timeouts.first_byte, timeouts.idle, tls
            )
        except (TimeoutError, OSError, http1.HTTPError) as exc:
            raise UpstreamError(f"cannot reach upstream: {os_error(exc)}") from None
        if status >= 300:
            raise UpstreamStatus(status, conn.headers, _scrub(body, headers))
        try:
            return msgspec.json.decode(body)
        except msgspec.DecodeError:
            raise UpstreamError("upstream sent a body that is not valid JSON") from None

    async def probe(self, url: str, *, timeout: float, tls: TLSConfig | None = None) -> int:
        """``GET url`` (a health endpoint) within ``timeout``: its status, 0 when it could
        not be reached, or not in time."""
        try:
            status, _, _ = await self._get(url, {}, timeout, timeout, timeout, tls, limit=4096)
        except (TimeoutError, OSError, http1.HTTPError, UpstreamError):
            return 0
        return status

    async def _get(
        self,
        url: str,
        headers: dict,
        connect: float,
        total: float,
        idle: float,
        tls: TLSConfig | None,
        limit: int = 8 * 1024 * 1024,
    ) -> tuple[int, bytes, http1.Connection]:
        """One ``GET`` on a new connection: (status, body up to ``limit``, connection)."""
        origin, path = self._target(url, tls)
        data = _request_bytes("GET", path, origin, headers, b"")
        pool = self._pool_of(asyncio.get_running_loop())
        async with asyncio.timeout(total):
            conn = await pool.acquire(origin, connect, fresh=True)
            try:
                conn.send(*data)
                await conn.headers_of_response(total)
                body = await _read_limited(conn, idle, limit=limit)
            except BaseException:
                pool.discard(conn)
                raise
            pool.release(conn)
            return conn.status, body, conn

    async def aclose(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def _request_bytes(
    method: str, path: str, origin, headers: dict, body: bytes
) -> tuple[bytes, bytes]:
    """The request's head and body."""
    try:
        return http1.request_head(method, path, origin, headers, len(body)), body
    except (ValueError, UnicodeEncodeError) as exc:  # a header that could inject a line
        raise UpstreamError(f"cannot send the request upstream: {exc}", retryable=False) from None


def _scrub(data: bytes, headers: dict) -> bytes:
    """An upstream may echo our credentials in an error; they must never reach the client."""
    for name in ("authorization", "x-api-key"):
        value = headers.get(name)
        if value:
            secret = value.split(" ", 1)[-1].encode()
            if len(secret) >= 8:
                data = data.replace(secret, b"<redacted>")
    return data


async def _read_limited(conn: http1.Connection, idle: float, limit: int = _MAX_ERROR_BODY) -> bytes:
    """Up to ``limit`` bytes of a body (64 KB: an error's); what cannot be read in time is
    left out."""
    out = bytearray()
    try:
        while len(out) <= limit and (chunk := await conn.read(idle)) is not None:
            out += chunk
    except (TimeoutError, http1.HTTPError):
        pass
    return bytes(out[:limit])
