"""The upstream hop as one small interface.

The gateway, the health probes and the model listing reach upstreams only through a
:class:`Transport`: :class:`~prefixgate.upstream.client.Upstream` (the project's own
HTTP/1.1 client) in service, :class:`FakeTransport` in tests that want the pipeline without
a network. Both raise the same errors: the error tree, a status other than 2xx as
:class:`~prefixgate.upstream.client.UpstreamStatus` (read as the engine meant it by
:class:`~prefixgate.engine.client.EngineClient`, which the gateway sends through).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import msgspec

from prefixgate.errors import UpstreamError
from prefixgate.upstream.client import UpstreamStatus

if TYPE_CHECKING:
    from prefixgate.config import Timeouts, TLSConfig


class Response(Protocol):
    """An open upstream response with a 2xx status, read chunk by chunk."""

    status: int
    headers: Mapping[str, str]

    async def next(self, timeout: float, *, first: bool = False) -> bytes | None:
        """The next body chunk, ``None`` at the end; ``UpstreamTimeout`` past ``timeout``."""

    async def aclose(self) -> None:
        """Done with it: an unfinished response is cancelled upstream."""


class Transport(Protocol):
    async def open(
        self,
        url: str,
        body: bytes,
        *,
        timeouts: Timeouts,
        extra_headers: dict | None = None,
        tls: TLSConfig | None = None,
        channel: str | None = None,
    ) -> Response:
        """``POST`` a JSON body; the response once its head arrived with a 2xx status
        (any other status raises :class:`~prefixgate.upstream.client.UpstreamStatus`). ``channel``: whose connection limits
        apply (each channel's connections are its own)."""

    async def get_json(
        self,
        url: str,
        *,
        timeouts: Timeouts,
        extra_headers: dict | None = None,
        tls: TLSConfig | None = None,
    ) -> object:
        """``GET`` a JSON document (a model list)."""

    async def probe(self, url: str, *, timeout: float, tls: TLSConfig | None = None) -> int:
        """``GET`` a health URL: its status (0 when it could not be reached in time)."""

    async def aclose(self) -> None: ...


# -- the fake ---------------------------------------------------------------------------------
@dataclass
class FakeReply:
    """What the fake upstream answers: a status, headers and the body in chunks."""

    status: int = 200
    headers: dict = field(default_factory=lambda: {"content-type": "application/json"})
    chunks: Iterable[bytes] = ()

    @classmethod
    def json(cls, obj: object, status: int = 200) -> FakeReply:
        return cls(status, {"content-type": "application/json"}, [msgspec.json.encode(obj)])

    @classmethod
    def sse(cls, *events: object) -> FakeReply:
        """A stream of ``data:`` events (objects encoded; bytes as they are)."""
        lines = [
            b"data: " + (e if isinstance(e, bytes) else msgspec.json.encode(e)) + b"\n\n"
            for e in events
        ]
        return cls(200, {"content-type": "text/event-stream"}, lines)


class FakeResponse:
    def __init__(self, reply: FakeReply) -> None:
        self.status = reply.status
        self.headers = reply.headers
        self._chunks = list(reply.chunks)
        self.closed = False

    async def next(self, timeout: float, *, first: bool = False) -> bytes | None:
        if self.closed:
            raise UpstreamError("read from a closed response")
        return self._chunks.pop(0) if self._chunks else None

    async def aclose(self) -> None:
        self.closed = True


Handler = Callable[[str, str, dict, bytes], FakeReply | Awaitable[FakeReply]]


class FakeTransport:
    """An in-memory upstream: ``handler(method, url, headers, body)`` gives the reply.
    Every request is kept in ``requests``; every response it opened in ``responses``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[tuple[str, str, dict, bytes]] = []
        self.responses: list[FakeResponse] = []

    async def _reply(self, method: str, url: str, headers: dict, body: bytes) -> FakeReply:
        self.requests.append((method, url, headers, body))
        reply = self.handler(method, url, headers, body)
        if not isinstance(reply, FakeReply):
            reply = await reply
        return reply

    async def open(
        self, url, body, *, timeouts, extra_headers=None, tls=None, channel=None
    ) -> FakeResponse:
        reply = await self._reply("POST", url, dict(extra_headers or {}), body)
        if reply.status >= 300:
            raise UpstreamStatus(reply.status, reply.headers, b"".join(reply.chunks))
        resp = FakeResponse(reply)
        self.responses.append(resp)
        return resp

    async def get_json(self, url, *, timeouts, extra_headers=None, tls=None) -> object:
        reply = await self._reply("GET", url, dict(extra_headers or {}), b"")
        data = b"".join(reply.chunks)
        if reply.status >= 300:
            raise UpstreamStatus(reply.status, reply.headers, data)
        return msgspec.json.decode(data)

    async def probe(self, url: str, *, timeout: float, tls=None) -> int:
        return (await self._reply("GET", url, {}, b"")).status

    async def aclose(self) -> None:
        pass
