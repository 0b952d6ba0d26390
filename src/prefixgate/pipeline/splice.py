"""Relaying a stream inside the I/O callbacks: the upstream connection's parser hands each
body read to the relay, and what the relay makes of it is written to the client's
connection there and then, with no task woken per chunk.

This is how a stream is relayed when both ends are this project's own HTTP/1.1 code (the
server's ``prefixgate.splice`` extension, the client's :class:`~prefixgate.upstream.http1.
Connection`); anywhere else (``--http uvicorn``, the in-memory fake transport) the same
relay is pumped by the response's task, a read and a ``send`` per chunk
(:class:`~prefixgate.pipeline.relays.Stream`). The per-chunk cost of both is in
docs/performance.md ("Agent-scale streaming").

The lane: while spliced, the splice is the upstream transport's protocol, and a read that
is one whole chunk of the relay's current template (:class:`~prefixgate.pipeline.relays.
Lane`: most reads of a stream, once a few have been seen) is checked and written to the
client's transport right there, in one Python call, touching no object but the splice;
any other read goes to the connection and its relay as above, and the lane is looked at
again after it. The lane closes while the client's connection is paused, closed or lost
(the server's protocol tells the splice: ``on_pause``), and whenever the relay has none.

What the task still does: it starts the splice and waits for its end, and it is cancelled
when the client leaves (the server's doing), which detaches the splice and closes the
upstream response. Back-pressure: while the client's connection is past its write buffer's
high-water mark the upstream connection stops reading, and reads again when it drains.
An upstream that sends nothing for ``idle`` seconds fails the stream, as a read would: one
timer per stream, which lapses every quarter of ``idle`` and then looks whether body bytes
came meanwhile (a read only sets a flag, no clock is read per chunk), so a silent
upstream fails after ``idle`` to 1.25 × ``idle`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec

from prefixgate.chunked import READ_LINES, SIZE_LINES
from prefixgate.errors import GatewayError, UpstreamError, UpstreamTimeout

log = logging.getLogger("prefixgate.relay")
GRACE = 1.0  # seconds an upstream has to end its body once the answer went out
_decode = msgspec.json.decode
_encode = msgspec.json.encode
_READS = len(READ_LINES)


class Splice:
    """One stream spliced from an upstream connection (``conn``) into a client's response
    (``client``: the server's request, with ``write_body``, ``framed`` and ``conn``; once
    the head is out and the body chunked (``framed``), each read's bytes go to the
    connection's ``write_chunk``) through ``relay``."""

    __slots__ = (  # what each read touches first (at a thousand streams, each a cache miss)
        "head",
        "hl",
        "tail2",
        "t2",
        "least",
        "fresh",
        "wire",
        "keys",
        "ohead",
        "otail",
        "ol",
        "recode",
        "poller",
        "raw",
        "ended",
        "out",
        "relay",
        "client",
        "conn",
        "idle",
        "loop",
        "done",
        "last",
        "timer",
        "swapped",
    )

    def __init__(self, relay, client, conn, idle: float) -> None:
        self.relay, self.client, self.conn, self.idle = relay, client, conn, idle
        self.loop = conn.loop
        # The body bytes of this read, relayed at its end (flush): the connection's own
        # buffer, which its parser appends to (no Python call per HTTP chunk); the relay
        # is fed once a read.
        self.raw = conn.chunks
        self.out: list[bytes] = []  # the answer's last bytes, written by flush
        self.ended = False  # the last bytes are in ``out`` (or written)
        self.done = self.loop.create_future()
        self.last = self.loop.time()  # by the idle timer's checks: when body bytes last came
        self.fresh = False  # body bytes came since the idle timer's last check
        self.timer: asyncio.TimerHandle | None = None
        self.poller = conn.poller
        # The lane (Relay.lane): a read that is one whole chunk of the relay's template,
        # checked and written here, the upstream connection's protocol meanwhile (see
        # data_received). ``head`` None: no lane, every read goes the connection's way.
        self.head: bytes | None = None
        self.hl = self.t2 = self.least = self.ol = 0
        self.tail2 = self.otail = b""
        self.wire: Any = None  # the client's transport (a lane's writes)
        self.keys: frozenset[str] | None = None
        self.ohead: bytes | None = None
        self.recode = False
        self.swapped = False  # the upstream transport's protocol is this splice

    async def run(self, first: bytes) -> None:
        """Relay ``first`` and the rest of the body; return once the answer is complete
        (or failed) and written."""
        self.raw.appendleft(first)  # (taken from the connection before the splice began)
        self.timer = self.loop.call_at(self.last + self.idle / 4, self._check_idle)
        try:
            self.begin()
            await self.done
        finally:
            self._stop()  # (the upstream transport's protocol given back, whatever happened)

    def begin(self) -> None:
        """Take the upstream connection's body from here on: its sink, and its transport's
        protocol (every read comes to :meth:`data_received` first)."""
        self.conn.attach(self)
        conn = self.conn
        transport = conn.transport
        if not self.done.done() and transport is not None and not conn.closed:
            transport.set_protocol(self)
            self.swapped = True
            self.client.conn.on_pause = self._stalled
            self._arm()

    # -- the upstream transport's protocol, while spliced ------------------------------------
    def data_received(self, data: bytes) -> None:
        """A read: one whole chunk of the lane's template (most reads of a stream) is
        checked and written here, as the relay would make it and the connection would
        frame it (``Connection.data_received``: the size line the server writes for its
        size, that many bytes, CRLF; the parser left between two chunks); any other read
        is the connection's, and the lane is looked at again after it."""
        head = self.head
        if head is not None:
            n = len(data)
            if n < _READS and (line := READ_LINES[n]) is not None:
                k = len(line)
                j = k + self.hl
                t2 = self.t2
                if data[:k] == line and data[k:j] == head and data[-t2:] == self.tail2:
                    # the string, its quotes included (``head``'s last byte and
                    # ``tail2``'s first: a shared one leaves a byte, fewer than ``least``)
                    tok = data[j - 1 : 1 - t2]
                    if len(tok) >= self.least:
                        try:
                            piece = _decode(tok)
                        except msgspec.DecodeError:
                            piece = None
                        keys = self.keys  # (None: none, and no hash of the piece taken)
                        if piece is not None and (keys is None or piece not in keys):
                            self.fresh = True
                            if (poller := self.poller) is not None:
                                poller.touch()
                            ohead = self.ohead
                            if ohead is None:
                                self.wire.write(data)
                            else:
                                mid = _encode(piece) if self.recode else tok
                                m = self.ol + len(mid)
                                size = SIZE_LINES[m] if m < 4096 else b"%x\r\n" % m
                                self.wire.write(b"".join((size, ohead, mid, self.otail, b"\r\n")))
                            return
        self.conn.data_received(data)
        self._arm()

    def eof_received(self) -> bool:
        return self.conn.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.head = None
        self.conn.connection_lost(exc)

    def pause_writing(self) -> None:
        self.conn.pause_writing()

    def resume_writing(self) -> None:
        self.conn.resume_writing()

    def _arm(self) -> None:
        """The lane, when reads may take it: the relay has one, the upstream's parser sits
        between two chunks of this splice's body, the client's head is out and its
        connection open and writable, and the answer not ended."""
        self.head = None
        conn, client = self.conn, self.client
        if self.ended or conn.sink is not self or not conn.between or conn.paused:
            return
        if not client.framed or client.conn.closed or client.conn.write_paused:
            return
        lane = self.relay.lane()
        if lane is None:
            return
        # (the piece's quotes compared with the ends: a read's piece is a string)
        self.hl, self.tail2 = len(lane.head) + 1, b'"' + lane.tail + b"\r\n"
        self.t2, self.least, self.keys = len(self.tail2), lane.least, lane.keys or None
        self.ohead, self.otail, self.recode = lane.out_head, lane.out_tail, lane.recode
        self.ol = len(lane.out_head or b"") + len(lane.out_tail)
        self.wire = client.conn.transport
        self.head = lane.head + b'"'

    def _stalled(self) -> None:
        """The client's connection paused writing (its buffer is full) or was lost: the
        lane closes; a paused one stops the upstream's reads until it drains."""
        self.head = None
        cc = self.client.conn
        if cc.write_paused and not cc.closed:
            self.conn.hold(True)
            cc.on_resume = self._resume

    # -- the connection's side (http1.Sink: ``news``, ``flush``, ``feed``) ------------------
    def flush(self) -> None:
        """The end of one read: what it brought (in the connection's ``chunks``) goes
        through the relay; the last bytes end the response."""
        raw = self.raw
        if raw:
            if len(raw) == 1:
                data = raw.popleft()  # (the deque keeps its block: no allocation a read)
            else:
                data = b"".join(raw)
                raw.clear()
            self.feed(data)
        elif self.ended:
            self._write_end(b"")

    def feed(self, data: bytes, framed: bytes | None = None) -> None:
        """One read's body bytes through the relay, and what that makes out, in one write.
        ``framed``: the read as it came, one chunk framed as the server frames one; when
        the relay gives its data back as it came (a chat chunk passed through), the read
        is what the client gets, written as it is."""
        self.fresh = True
        if self.ended:  # (bytes past the stream's end, after [DONE]: dropped)
            self._write_end(b"")
            return
        relay = self.relay
        try:
            made = relay.feed(data)
            if relay.done:
                made += relay.end()
                self.ended = True
        except GatewayError as e:
            made = relay.fail(e)
            self.ended = True
        except Exception:
            made = self._internal()
        if self.ended:
            self._write_end(made)
        elif made:
            client = self.client
            if client.framed:  # the head is out, the body chunked: past the request
                if made is data and framed is not None:
                    paused = client.conn.write_framed(framed)
                else:
                    paused = client.conn.write_chunk(made)
            else:  # the first bytes (with the head), or a body that is not chunked
                client.write_body(made, True)
                paused = client.conn.write_paused
            if paused:  # the client's buffer is full: stop reading upstream until it drains
                self._stalled()

    def _write_end(self, made: bytes) -> None:
        out = self.out
        out.append(made)
        data = b"".join(out)
        out.clear()
        self.client.write_body(data, False)
        self._settled()

    def news(self) -> None:
        """The upstream response completed or failed."""
        if self.raw:
            self.flush()  # what came before the end, in the same read: relayed first
        if self.ended:
            self._settled()  # the end of a body whose answer already went out
            return
        conn = self.conn
        if conn.error is not None:
            err = UpstreamError(f"upstream connection failed mid-response: {conn.error}")
        elif conn.complete:
            err = None
        else:
            return
        try:
            out = self.relay.end() if err is None else self.relay.fail(err)
        except GatewayError as e:
            out = self.relay.fail(e)
        except Exception:
            out = self._internal()
        self.ended = True
        self.out.append(out)
        self.flush()

    def _settled(self) -> None:
        """Done once the answer went out and the upstream's body ended too, so that its
        connection is reused (an answer ends at ``[DONE]``, usually a moment before the
        body's last bytes); an upstream slow to end it has ``GRACE`` seconds."""
        if self.done.done():
            return
        conn = self.conn
        if conn.complete or conn.error is not None or conn.closed:
            self.done.set_result(None)
        elif self.timer is None or self.timer.when() > self.loop.time() + GRACE:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = self.loop.call_later(GRACE, self._give_up)

    def _give_up(self) -> None:
        self.timer = None
        if not self.done.done():
            self.done.set_result(None)

    # -- helpers -----------------------------------------------------------------------------
    def _resume(self) -> None:
        self.client.conn.on_resume = None
        self.conn.hold(False)
        if self.swapped:
            self._arm()

    def _check_idle(self) -> None:
        self.timer = None
        if self.ended:
            self._give_up()
            return
        now = self.loop.time()
        # Bytes came since the last check, or none were read because the client is slow
        # (not the upstream's idling): counted as if at this check.
        if self.fresh or self.conn.paused:
            self.fresh = False
            self.last = now
        due = self.last + self.idle
        if now + 0.001 < due:
            self.timer = self.loop.call_at(min(due, now + self.idle / 4), self._check_idle)
            return
        err = UpstreamTimeout(f"upstream sent nothing for {self.idle:g} s mid-response")
        self.out.append(self.relay.fail(err))
        self.ended = True
        self.flush()

    def _internal(self) -> bytes:
        log.exception("internal error relaying a stream")
        self.ended = True
        return self.relay.fail(GatewayError("internal error"))

    def _stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.head = None
        conn = self.conn
        if self.swapped:
            self.swapped = False
            if conn.transport is not None and not conn.closed:
                conn.transport.set_protocol(conn)
        conn.detach()
        cc = self.client.conn
        if cc.on_resume == self._resume:
            cc.on_resume = None
        if cc.on_pause == self._stalled:
            cc.on_pause = None
