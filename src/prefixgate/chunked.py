"""HTTP/1.1 chunked framing shared by the gateway's server and its upstream client: the
size line of a chunk, looked up for the sizes a stream's chunks have (under 4 KiB)
instead of formatted a chunk. No I/O."""

from __future__ import annotations

__all__ = ["READ_LINES", "SIZE_LINES"]

# ``b"%x\r\n" % n`` for n < 4096: the lower-case hex every common server writes.
SIZE_LINES = tuple(b"%x\r\n" % n for n in range(4096))


def _read_lines() -> tuple[bytes | None, ...]:
    lines: list[bytes | None] = [None] * 4103
    for m in range(1, 4096):
        lines[len(SIZE_LINES[m]) + m + 2] = SIZE_LINES[m]
    return tuple(lines)


# By a read's length: the size line of the one chunk (1 to 4,095 bytes) that a read of
# exactly that length would be, framed as above, with its CRLF (None: no such chunk).
# The lengths a size line's 1, 2 or 3 hex digits leave do not overlap, so there is one.
READ_LINES = _read_lines()
