"""HTTP/1.1 chunked framing shared by the gateway's server and its upstream client: the
size line of a chunk, looked up for the sizes a stream's chunks have (under 4 KiB)
instead of formatted a chunk. No I/O."""

from __future__ import annotations

__all__ = ["SIZE_LINES"]

# ``b"%x\r\n" % n`` for n < 4096: the lower-case hex every common server writes.
SIZE_LINES = tuple(b"%x\r\n" % n for n in range(4096))
