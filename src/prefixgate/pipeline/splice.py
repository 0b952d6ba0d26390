"""Relaying a stream inside the I/O callbacks: the upstream connection's parser hands each
body read to the relay, and what the relay makes of it is written to the client's
connection there and then, with no task woken per chunk.

This is how a stream is relayed when both ends are this project's own HTTP/1.1 code (the
server's ``prefixgate.splice`` extension, the client's :class:`~prefixgate.upstream.http1.
Connection`); anywhere else (``--http uvicorn``, the in-memory fake transport) the same
relay is pumped by the response's task, a read and a ``send`` per chunk
(:class:`~prefixgate.pipeline.relays.Stream`). The per-chunk cost of both is in
docs/performance.md ("Agent-scale streaming").

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

from prefixgate.errors import GatewayError, UpstreamError, UpstreamTimeout

log = logging.getLogger("prefixgate.relay")
GRACE = 1.0  # seconds an upstream has to end its body once the answer went out


class Splice:
    """One stream spliced from an upstream connection (``conn``) into a client's response
    (``client``: the server's request, with ``write_body``, ``framed`` and ``conn``; once
    the head is out and the body chunked (``framed``), each read's bytes go to the
    connection's ``write_chunk``) through ``relay``."""

    __slots__ = (  # what each read touches first (at a thousand streams, each a cache miss)
        "raw",
        "fresh",
        "ended",
        "relay",
        "client",
        "out",
        "conn",
        "idle",
        "loop",
        "done",
        "last",
        "timer",
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

    async def run(self, first: bytes) -> None:
        """Relay ``first`` and the rest of the body; return once the answer is complete
        (or failed) and written."""
        self.raw.appendleft(first)  # (taken from the connection before the splice began)
        self.timer = self.loop.call_at(self.last + self.idle / 4, self._check_idle)
        self.conn.attach(self)
        try:
            await self.done
        finally:
            self._stop()

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
            if paused:
                self.conn.hold(True)  # the client's buffer is full: stop reading upstream
                client.conn.on_resume = self._resume

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
        self.conn.detach()
        if self.client.conn.on_resume == self._resume:
            self.client.conn.on_resume = None
