"""Incremental Server-Sent Events decoding (bytes in, events out). No I/O."""

from __future__ import annotations


class SSEDecoder:
    """Feed raw bytes; get back complete events as ``(event_name, data)`` pairs, where
    ``data`` is the joined ``data:`` lines (bytes). Comments and ids are ignored."""

    __slots__ = ("buf",)  # the bytes of an event not yet complete

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, chunk: bytes) -> list[tuple[bytes | None, bytes]]:
        if not self.buf and single(chunk):  # a read that is one whole event, the usual case
            return [(None, chunk[6:-2])]
        buf = self.buf + chunk if self.buf else chunk
        # ``find`` rather than ``in``: a bytes ``in`` first tries its operand as an int
        # and raises (and clears) a TypeError, thousands of instructions an event.
        if buf.find(b"\r") >= 0:
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        events: list[tuple[bytes | None, bytes]] = []
        find, start = buf.find, 0
        # Scanned with an offset, the rest sliced off once: a read holding many events
        # costs linear, not quadratic, copying.
        while (end := find(b"\n\n", start)) >= 0:
            block = buf[start:end]
            start = end + 2
            if block[:6] == b"data: " and block.find(b"\n") < 0:
                events.append((None, block[6:]))  # the common event: one data line
                continue
            ev = _parse_block(block)
            if ev is not None:
                events.append(ev)
        self.buf = buf[start:] if start else buf
        return events

    def flush(self) -> list[tuple[bytes | None, bytes]]:
        """Whatever is left when the stream ends (a last event without its blank line)."""
        block, self.buf = self.buf, b""
        ev = _parse_block(block.strip(b"\n"))
        return [ev] if ev is not None else []

    @property
    def pending(self) -> int:
        return len(self.buf)


def single(chunk: bytes) -> bool:
    """Whether ``chunk`` is exactly one event of one ``data: `` line (its only line end
    the blank line that ends it; a lone CR ends a line too, so none may be in it)."""
    return (
        chunk[:6] == b"data: "
        and chunk.find(b"\n") == len(chunk) - 2
        and chunk[-1:] == b"\n"
        and chunk.find(b"\r") < 0
    )


def first_event(chunk: bytes) -> tuple[bytes | None, bytes] | None:
    """The first complete event of ``chunk`` (None when none is complete in it), parsing
    nothing past it: a chunk may hold a whole answer."""
    if b"\r" in chunk:
        chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    start = 0
    while (end := chunk.find(b"\n\n", start)) >= 0:
        ev = _parse_block(chunk[start:end])
        if ev is not None:
            return ev
        start = end + 2
    return None


def _parse_block(block: bytes) -> tuple[bytes | None, bytes] | None:
    event: bytes | None = None
    data: list[bytes] = []
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            v = line[5:]
            data.append(v[1:] if v.startswith(b" ") else v)
        elif line.startswith(b"event:"):
            event = line[6:].strip()
    if not data and event is None:
        return None
    return event, b"\n".join(data)
