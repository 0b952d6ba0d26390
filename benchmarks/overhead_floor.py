"""The floor: the least a Python proxy on this machine adds, for ``overhead.py --floor``.

    python benchmarks/overhead_floor.py --port P --upstream-port U [--busy-poll-us 200]

A uvloop protocol that reads a whole HTTP/1.1 request (by its content-length), sends it
verbatim upstream on one kept-alive connection (a POST's path rewritten to the fake
upstream's ``/v1/chat/completions``, so a Messages body travels too) and relays the answer's bytes
verbatim (content-length or chunked). No parsing beyond the framing, no JSON, no
conversion, no record: what is left is the hop itself (two more socket reads and writes a
request, and the wake-ups of the core it runs on), against which the gateway's own work
can be told apart. One request at a time per client connection.
"""

from __future__ import annotations

import argparse
import asyncio

from prefixgate import busypoll


def _head_end(buf: bytearray) -> int:
    i = buf.find(b"\r\n\r\n")
    return -1 if i < 0 else i + 4


def _length(head: bytes) -> int | None:
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line[15:])
    return None


class Upstream(asyncio.Protocol):
    """One kept-alive connection to the upstream; relays one answer at a time."""

    def __init__(self, loop, poller: busypoll.BusyPoll | None) -> None:
        self.loop, self.poller = loop, poller
        self.buf = bytearray()
        self.client: asyncio.Transport | None = None
        self.owner: Client | None = None
        self.need: int | None = None  # bytes left of a content-length body
        self.chunked = False
        self.busy = False  # an answer is being relayed

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.poller is not None:
            self.poller.touch()
        if self.need is None and not self.chunked:
            self.buf += data
            end = _head_end(self.buf)
            if end < 0:
                return
            head = bytes(self.buf[:end])
            n = _length(head)
            self.chunked = n is None
            self.need = None if n is None else n + end
            data, self.buf = bytes(self.buf), bytearray()
        self.client.write(data)
        if self.chunked:
            self.buf += data[-5:]
            if self.buf.endswith(b"0\r\n\r\n"):
                self._done()
            else:
                del self.buf[:-5]
        else:
            self.need -= len(data)
            if self.need <= 0:
                self._done()

    def _done(self) -> None:
        self.need, self.chunked, self.buf = None, False, bytearray()
        self.busy = False
        self.owner.data_received(b"")  # a request that came meanwhile


class Client(asyncio.Protocol):
    def __init__(self, loop, upstream_port: int, poller: busypoll.BusyPoll | None) -> None:
        self.loop, self.upstream_port, self.poller = loop, upstream_port, poller
        self.buf = bytearray()
        self.up: Upstream | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.loop.create_task(self._connect())

    async def _connect(self) -> None:
        _, self.up = await self.loop.create_connection(
            lambda: Upstream(self.loop, self.poller), "127.0.0.1", self.upstream_port
        )
        self.up.client, self.up.owner = self.transport, self
        self.data_received(b"")

    def data_received(self, data: bytes) -> None:
        if self.poller is not None:
            self.poller.touch()
        self.buf += data
        if self.up is None or self.up.busy:
            return
        end = _head_end(self.buf)
        if end < 0:
            return
        head = bytes(self.buf[:end])
        total = end + (_length(head) or 0)
        if len(self.buf) < total:
            return
        line, rest = head.split(b"\r\n", 1)
        if line.startswith(b"POST "):
            line = b"POST /v1/chat/completions HTTP/1.1"
        request = line + b"\r\n" + rest + self.buf[end:total]
        del self.buf[:total]
        self.up.busy = True
        self.up.transport.write(request)


async def main(port: int, upstream_port: int, busy_poll_us: float) -> None:
    loop = asyncio.get_running_loop()
    poller = busypoll.poller_for(loop, busy_poll_us)
    server = await loop.create_server(
        lambda: Client(loop, upstream_port, poller), "127.0.0.1", port
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream-port", type=int, required=True)
    ap.add_argument("--busy-poll-us", type=float, default=0.0)
    args = ap.parse_args()
    import uvloop

    uvloop.run(main(args.port, args.upstream_port, args.busy_poll_us))
