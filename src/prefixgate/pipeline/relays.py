"""What every API's last step, the relay, is built of: the open upstream response answered
to the client, in the client's protocol (each API's relay step is in its package:
``apis/<api>/steps.py``).

A whole (JSON) answer is converted or passed through at once (:class:`Answer`). A stream
goes through a :class:`Relay`, which says what each upstream read becomes for the client
and does no I/O: :class:`Converted` (a chat stream through an API's state machine that
emits its event sequence: Anthropic's, the Responses API's), the Chat API's ``ChatRelay``
(``apis/chat/steps.py``) and :class:`Passthrough` (an upstream that speaks the client's
protocol). :class:`Stream` drives a relay: spliced into
the I/O callbacks when both ends are this project's own HTTP code (``splice.py``), else
pumped by the response's task. A relay keeps the raw upstream usage for the record and
finishes the record (:meth:`~.exchange.Exchange.finish`) before the answer's last bytes
go out; a record still without a status at the end means the client left, and the
upstream request is then cancelled by closing its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import NamedTuple

import msgspec
from starlette.responses import Response

from prefixgate.engine.channel import secret_of, stream_error
from prefixgate.errors import GatewayError, UpstreamError
from prefixgate.pipeline.exchange import Exchange
from prefixgate.pipeline.splice import GRACE, Splice
from prefixgate.record.reason import failed
from prefixgate.sse import SSEDecoder
from prefixgate.usage import Usage

_decode = msgspec.json.decode
_encode = msgspec.json.encode
_QUOTE = 34  # ord('"')
_NO_KEYS: frozenset[str] = frozenset()


async def settle_once(x: Exchange) -> None:
    """A whole answer to a request that asked: its miss ledger computed before it is
    made (from the engine's usage in the chat completion), for the extension."""
    if x.verdict is not None and isinstance(x.first, dict):
        await x.settle(Usage.from_openai(x.first.get("usage")))


def json_object(data: bytes) -> dict:
    """An upstream's JSON object (an answer, a stream event); anything else is its error."""
    try:
        obj = _decode(data)
    except msgspec.DecodeError:
        raise UpstreamError("upstream sent invalid JSON", retryable=False) from None
    if not isinstance(obj, dict):
        raise UpstreamError("upstream sent a JSON value that is not an object", retryable=False)
    return obj


def set_reported_usage(rec, usage: dict) -> None:
    rec.reported_input_tokens = usage.get("input_tokens")
    rec.reported_cache_read_tokens = usage.get("cache_read_input_tokens")
    rec.reported_output_tokens = usage.get("output_tokens")


# -- passed through: an upstream that speaks the client's protocol ----------------------
def passthrough(
    x: Exchange, usage_of: Callable[[dict, Usage], None], error_event: Callable[..., bytes]
) -> Response:
    """The upstream's answer as it came, the public model name restored; ``usage_of``
    reads the usage of the whole answer or of each stream event into the record's.
    ``x.first`` is the first body chunk of a stream, or the whole JSON object otherwise."""
    rec = x.record
    if not rec.stream:
        obj, usage = x.first, Usage()
        usage_of(obj, usage)
        if x.out["model"] != x.body["model"]:
            obj["model"] = x.body["model"]
        rec.status = 200
        return Answer(_encode(obj), x, usage)

    return Stream(Passthrough(x, usage_of, error_event))


# -- stream relays: what happens to each upstream read, without I/O ---------------------
class Lane(NamedTuple):
    """What a relay makes, as it stands, of a read that is its current template's chunk
    with another piece (``head`` + a JSON string + ``tail``), when making it changes
    nothing in the relay: the splice takes such reads by itself, framed and all, without
    a call (``pipeline/splice.py``), and gives them out as the relay's ``feed`` would.

    The piece is taken when it is at least ``least`` bytes (quotes included), decodes
    (msgspec), and is none of ``keys`` (pieces the relay's search would stop at). It goes
    out as the read itself when ``out_head`` is None; else as ``out_head`` + the piece +
    ``out_tail``, the piece encoded again (``recode``) or its bytes as they came."""

    head: bytes
    tail: bytes
    least: int
    keys: frozenset[str]
    out_head: bytes | None
    out_tail: bytes
    recode: bool


class Relay:
    """A stream's way from the upstream's bytes to the client's, without I/O: ``feed``
    each body read and write what it returns; once ``done`` (the upstream's end marker
    seen) or at the upstream's end, ``end()`` gives the last bytes; a failure (raised by
    ``feed`` or ``end``, or the connection's) is answered with ``fail(err)``'s bytes.
    ``end`` and ``fail`` finish the record before returning its last bytes, so a client
    holding the whole answer implies a journaled record. Driven by the response's task
    (:class:`Stream`) or inside the I/O callbacks (``pipeline/splice.py``)."""

    # Slots, and what every read asks kept in them: at a thousand streams each read finds
    # its stream's objects gone from the CPU's caches, and each object it touches is a
    # miss (docs/performance.md, "The relay near its floor").
    __slots__ = ("quiet", "timing", "done", "x", "rec", "held", "dec", "secret")

    def __init__(self, x: Exchange) -> None:
        self.done = False  # (read after every read of a stream)
        self.x = x
        self.rec = x.record
        self.held: list[bytes] = []  # made but not yet returned (an error cut the read)
        self.dec = SSEDecoder()
        self.secret = secret_of(x.channel)
        # Nothing held and no event begun in ``dec`` (so a read may be a template's chunk):
        # set by each read's decoding way as it returns, cleared as it begins.
        self.quiet = True
        self.timing = self.rec.first_byte_at is None  # the first byte's time is still to come

    @property
    def usage(self) -> Usage:
        raise NotImplementedError

    def feed(self, chunk: bytes) -> bytes:
        raise NotImplementedError

    def end(self) -> bytes:
        raise NotImplementedError

    def error_bytes(self, err: GatewayError) -> bytes:
        raise NotImplementedError

    def lane(self) -> Lane | None:
        """The lane a read may take past ``feed`` now (None: every read is fed)."""
        return None

    def fail(self, err: GatewayError) -> bytes:
        failed(self.rec, err)
        self.x.finish(self.usage)
        return self._take() + self.error_bytes(err)

    def _take(self) -> bytes:
        held = self.held
        if not held:
            return b""
        self.held = []
        return held[0] if len(held) == 1 else b"".join(held)

    def _first_byte(self) -> None:
        if self.timing:
            self.timing = False
            if self.rec.first_byte_at is None:
                self.rec.first_byte_at = time.time()


class Converted(Relay):
    """A chat stream through a converting state machine (``start``, ``feed``, ``finish``,
    ``error``; its ``usage`` and ``finish_reason``); ``report`` records the usage the
    client was shown."""

    __slots__ = ("head", "tail", "kind", "conv", "report")

    def __init__(self, x: Exchange, conv, report: Callable[[Usage], None]) -> None:
        super().__init__(x)
        self.conv, self.report = conv, report
        self.held = [conv.start()]
        self.quiet = False
        # The template a read matched last, in this object: tried first (b"": none yet).
        self.head = self.tail = b""
        self.kind = ""

    @property
    def usage(self) -> Usage:
        return self.conv.usage

    def feed(self, chunk: bytes) -> bytes:
        if self.quiet:
            # A chunk like one seen, with another (non-empty) piece: its events made from
            # its bytes (Template.piece inline: most reads of a stream come this way). The
            # template matched last first, then the others.
            head, tail = self.head, self.tail
            if head and chunk.startswith(head) and chunk.endswith(tail):
                tok = chunk[len(head) : -len(tail)]
                if len(tok) >= 3 and tok[0] == _QUOTE and tok[-1] == _QUOTE:
                    try:
                        piece = _decode(tok)
                    except msgspec.DecodeError:
                        piece = None
                    if piece is not None:
                        if self.timing:
                            self._first_byte()
                        return self.conv.one(self.kind, piece)
            for t in self.conv.templates:
                head, h, tail, e = t.ends
                if chunk[:h] == head and chunk[e:] == tail and head is not self.head:
                    tok = chunk[h:e]
                    if len(tok) < 3 or tok[0] != _QUOTE or tok[-1] != _QUOTE:
                        continue
                    try:
                        piece = _decode(tok)
                    except msgspec.DecodeError:
                        continue
                    if self.timing:
                        self._first_byte()
                    self.head, self.tail, self.kind = head, tail, t.kind
                    return self.conv.one(t.kind, piece)
        self.quiet = False
        self._events(self.dec.feed(chunk))
        out = self._take()
        self.quiet = not self.dec.buf
        return out

    def lane(self) -> Lane | None:
        if not self.quiet or self.timing or self.done or not self.head:
            return None
        out = self.conv.lane(self.kind)  # (a delta of the open block, its kind's)
        if out is None:
            return None
        return Lane(self.head, self.tail, 3, _NO_KEYS, out[0], out[1], True)

    def _events(self, datas) -> None:
        conv, held, secret = self.conv, self.held, self.secret
        for _, data in datas:
            if data == b"[DONE]":
                self.done = True
                return
            obj = json_object(data)
            err = stream_error(obj, secret)
            if err is not None:
                raise err
            out = conv.feed(obj)
            if conv.learning > 0:
                conv.learn(data, obj)
            if out:
                self._first_byte()
                held.append(out)

    def end(self) -> bytes:
        if not self.done:
            self._events(self.dec.flush())
            if not self.done and self.conv.finish_reason is None:
                raise UpstreamError("upstream stream ended before it finished")
        self.held.append(self.conv.finish())
        self.rec.status = 200
        self.report(self.conv.usage)
        self.x.finish(self.conv.usage)
        return self._take()

    def error_bytes(self, err: GatewayError) -> bytes:
        return self.conv.error(err)


class Passthrough(Relay):
    """An upstream that speaks the client's protocol: its bytes as they came, the public
    model name restored and the channel's key redacted; ``usage_of`` reads the usage of
    each event that has any into the record's. Ends with the upstream's body."""

    __slots__ = ("usage_of", "error_event", "_usage", "swap")

    def __init__(self, x: Exchange, usage_of: Callable[[dict, Usage], None], error_event) -> None:
        super().__init__(x)
        self.usage_of, self.error_event = usage_of, error_event
        self._usage = Usage()
        theirs, public = x.out["model"], x.body["model"]
        self.swap = (theirs.encode(), public.encode()) if theirs != public else None

    @property
    def usage(self) -> Usage:
        return self._usage

    def feed(self, chunk: bytes) -> bytes:
        for _, data in self.dec.feed(chunk):
            if data.find(b'"usage"') >= 0:
                try:
                    obj = _decode(data)
                except msgspec.DecodeError:
                    continue
                if isinstance(obj, dict):
                    self.usage_of(obj, self._usage)
        self._first_byte()
        if self.swap:
            chunk = chunk.replace(*self.swap)
        if self.secret and chunk.find(self.secret) >= 0:  # an error event echoing the key
            chunk = chunk.replace(self.secret, b"<redacted>")
        return chunk

    def end(self) -> bytes:
        self.rec.status = 200
        self.x.finish(self._usage)
        return b""

    def error_bytes(self, err: GatewayError) -> bytes:
        return self.error_event(err)


class Stream:
    """A relay's SSE response (ASGI). Spliced when the server and the upstream response
    allow it (``pipeline/splice.py``), else pumped by this task: a read, then a ``send``,
    per chunk. The exchange is closed at the end either way, and when the client leaves
    (the task is cancelled, or ``send`` raises)."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.status_code = 200
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
            *((k.encode("latin-1"), v.encode("latin-1")) for k, v in relay.x.id_headers().items()),
        ]

    async def __call__(self, scope, receive, send) -> None:
        relay = self.relay
        x = relay.x
        try:
            ext = scope.get("extensions")
            client = ext.get("prefixgate.splice") if ext else None
            spliceable = getattr(x.upstream, "spliceable", None)
            if client is not None and spliceable is not None and x.verdict is None:
                # (a request that asked is pumped: its end waits for its miss ledger)
                client.start(self.status_code, self.raw_headers)
                await Splice(relay, client, spliceable(), x.channel.timeouts.idle).run(x.first)
            else:
                await self._pump(send)
        finally:
            await x.close(relay.usage)

    async def _pump(self, send) -> None:
        relay, x = self.relay, self.relay.x
        upstream, idle = x.upstream, x.channel.timeouts.idle
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            chunk, rest = x.first, False
            try:
                while True:
                    out = relay.feed(chunk)
                    if relay.done:
                        if x.verdict is not None:
                            await x.settle(relay.usage)
                        last, rest = out + relay.end(), True
                        break
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                    chunk = await upstream.next(idle)
                    if chunk is None:
                        if x.verdict is not None:
                            await x.settle(relay.usage)
                        last = relay.end()
                        break
            except GatewayError as e:
                last = relay.fail(e)
            await send({"type": "http.response.body", "body": last, "more_body": False})
        except OSError:
            return  # the client left (ASGI 2.4's send raises): closed on the way out
        if rest:  # the body's last bytes, usually a moment behind [DONE]: the connection is kept
            with contextlib.suppress(GatewayError, TimeoutError):
                async with asyncio.timeout(GRACE):
                    while await upstream.next(GRACE) is not None:
                        pass


class Answer(Response):
    """A whole JSON answer. Its record is finished (journaled) just before the body goes
    out, so a client that has the answer implies a record that survives a crash; the
    upstream's work and usage are recorded even if the client left meanwhile."""

    def __init__(self, body: bytes, x: Exchange, usage: Usage) -> None:
        super().__init__(body, media_type="application/json", headers=x.id_headers())
        self.x, self.usage = x, usage

    async def __call__(self, scope, receive, send) -> None:
        self.x.finish(self.usage)
        await super().__call__(scope, receive, send)
