"""The record journal: each record appended to a local file the moment its answer is
complete, and kept there until the store has it.

Why a journal: the store may be slow, locked or down, and the process may be killed; a
record that lives only in memory is lost with the process. One ``os.write`` of one encoded
line hands the bytes to the kernel, which keeps them when the process dies however it dies
(SIGKILL, the OOM killer, a crash). What it does not survive is the machine itself going
down (power, a kernel panic) before the kernel has flushed its page cache to the disk, a
matter of seconds (``vm.dirty_expire_centisecs``). An ``fsync`` per record would close
that window, at the cost of a disk flush on every request (milliseconds on most disks,
more than the gateway's whole cost per request), so it is not done.

Layout: ``<root>/<slot>/<seq>.jsonl``, JSON lines of :class:`Record`. Each process claims
the first slot whose lock file it can ``flock`` (the kernel drops the lock when the process
dies), so worker processes and gateways sharing one directory never write the same file.
A slot's segments are append-only; the one being written rotates past ``segment_bytes``,
and a segment is deleted once every record in it is stored. At open, the segments the
slot's last owner left and those of any slot nobody holds (a crashed process; fewer
workers than last time) are taken over: they are the backlog, stored first. The store
writes each ``request_id`` once, so a record stored just before a crash and replayed after
it is not stored twice.

Threads: ``append`` and the bookkeeping (``end``, ``sizes``, ``stored``) belong to the
event loop's thread; ``open``, ``read`` and ``delete`` do file I/O and run in the writer's
worker thread. A reader never reads past the sizes the loop's thread recorded, so it only
ever sees whole lines.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
from pathlib import Path
from typing import NamedTuple

import msgspec

from prefixgate.record.record import Record, Segment

log = logging.getLogger(__name__)

LOCK = "lock"
SUFFIX = ".jsonl"
SEGMENT_BYTES = 4 << 20


class Position(NamedTuple):
    """A place in the journal: the byte ``offset`` into segment ``seq``."""

    seq: int
    offset: int


class SegmentsJson(NamedTuple):
    """A record's segment lists as JSON, encoded once: spliced into its journal line and
    kept for its row in the store (``store/schema.py``), which then encodes nothing again.
    ``same``: ``segments_out`` is equal to ``segments_in`` (compared as encoded: equal
    lists of segments encode to equal bytes, and equal bytes decode to equal lists)."""

    segments_in: bytes | None
    segments_out: bytes | None
    same: bool


_SEGMENTS_ENCODER = msgspec.json.Encoder()


def encode_segments_json(
    segments_in: list[Segment] | None,
    segments_out: list[Segment] | None,
    buf: bytearray | None = None,
) -> SegmentsJson:
    """The two lists as JSON, each encoded once (once in all when they are one list).
    ``buf``: a buffer of the caller's thread to encode into (it keeps its size from one
    call to the next: no growing buffer each time), each list then copied out of it."""

    def enc(segments: list[Segment]) -> bytes:
        if buf is None:
            return _SEGMENTS_ENCODER.encode(segments)
        _SEGMENTS_ENCODER.encode_into(segments, buf)
        return bytes(buf)

    a = None if segments_in is None else enc(segments_in)
    if segments_out is None:
        return SegmentsJson(a, None, False)
    if segments_out is segments_in:
        return SegmentsJson(a, a, True)
    b = enc(segments_out)
    return SegmentsJson(a, b, b == a)


class Journal:
    def __init__(
        self, root: str | os.PathLike[str], *, max_bytes: int = 1 << 30, segment_bytes: int = 0
    ) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.segment_bytes = min(segment_bytes or SEGMENT_BYTES, max(4096, max_bytes // 4))
        self.slot: Path | None = None
        self.sizes: dict[int, int] = {}  # seq -> bytes of whole lines, every segment on disk
        self.bytes = 0  # their sum
        self.refused = 0  # records not taken since the journal last had room
        self.last_bytes = 0  # the size of the line appended last
        self.last_segments: SegmentsJson | None = None  # its segment lists, encoded
        self._refusing: str | None = None  # why records are refused, while they are
        self._seq = 0  # the segment being appended to
        self._fd = -1
        self._lock_fd = -1
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(Record)
        self._buf = bytearray()
        self._segments_buf = bytearray()

    @property
    def is_open(self) -> bool:
        return self._fd >= 0

    @property
    def end(self) -> Position:
        """Just after the last record appended."""
        return Position(self._seq, self.sizes.get(self._seq, 0))

    def start(self) -> Position:
        """The first record not deleted yet."""
        return Position(min(self.sizes, default=self._seq), 0)

    # -- open and close ------------------------------------------------------------------
    def open(self) -> int:
        """Claim a slot, take over what unheld slots left, and start a new segment.
        Returns the number of records already in the journal (the backlog)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.slot, self._lock_fd = _claim(self.root)
            self._adopt()
            backlog = 0
            for seq, path in _segments(self.slot):
                data = path.read_bytes()
                self.sizes[seq] = len(data)
                self.bytes += len(data)
                backlog += data.count(b"\n")
            self._seq = max(self.sizes, default=0) + 1
            self._fd = self._create(self._seq)
        except OSError as exc:
            raise OSError(
                f"cannot open the record journal in {self.root}: {exc.strerror or exc}"
                " (store.journal_path: a writable directory, or null for no journal)"
            ) from exc
        self.sizes[self._seq] = 0
        return backlog

    def close(self, *, everything_stored: bool) -> None:
        """Stop appending; when every record is stored, delete the segments and the slot."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._lock_fd < 0 or self.slot is None:
            return
        if everything_stored:
            for _, path in _segments(self.slot):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            self.sizes.clear()
            self.bytes = 0
            _remove_slot(self.slot, self._lock_fd)
            with contextlib.suppress(OSError):
                self.root.rmdir()  # only when no other slot is left in it
        else:
            os.close(self._lock_fd)
        self._lock_fd = -1

    def _adopt(self) -> None:
        """Move the segments of every slot nobody holds into this one, after its own."""
        assert self.slot is not None
        seq = max((s for s, _ in _segments(self.slot)), default=0)
        for other in sorted(self.root.iterdir()):
            if other == self.slot or not other.name.isdigit() or not other.is_dir():
                continue
            fd = _lock(other, create=False)
            if fd is None:
                continue  # a live process's slot
            segments = _segments(other)
            if segments:
                log.info("record journal: taking over %d segment(s) from %s", len(segments), other)
            for _, path in segments:
                seq += 1
                os.rename(path, self._path(seq))
            _remove_slot(other, fd)

    # -- appending (the event loop's thread) ----------------------------------------------
    def append(self, record: Record) -> Position | None:
        """Append one record as one line; its end, or None when the journal refuses it
        (full, or the disk failed: logged when that starts and when it ends). The segment
        lists are encoded first and spliced into the line as they are (the same bytes as
        the record encoded whole), then kept in ``last_segments`` for the store's row."""
        buf = self._buf
        segments = encode_segments_json(record.segments_in, record.segments_out, self._segments_buf)
        self.last_segments = segments
        line = record
        if segments.segments_in is not None or segments.segments_out is not None:
            line = msgspec.structs.replace(
                record,
                segments_in=_raw(segments.segments_in),
                segments_out=_raw(segments.segments_out),
            )
        self._encoder.encode_into(line, buf)
        buf.extend(b"\n")
        n = len(buf)
        if n > 1 << 20:
            self._buf = bytearray()  # do not keep a huge record's buffer
        if len(self._segments_buf) > 1 << 20:
            self._segments_buf = bytearray()
        if self.bytes + n > self.max_bytes:
            return self._refuse(
                f"it holds {self.bytes / (1 << 20):.1f} MiB, its bound (store.journal_max_mb)"
            )
        size = self.sizes[self._seq]
        try:
            if size and size + n > self.segment_bytes:
                self._rotate()
                size = 0
            written = os.write(self._fd, buf)
            while written < n:  # a short write: only when the disk fills up
                written += os.write(self._fd, memoryview(buf)[written:])
        except OSError as exc:
            with contextlib.suppress(OSError):  # never leave half a line behind
                os.ftruncate(self._fd, size)
            return self._refuse(f"writing failed: {exc.strerror or exc}")
        size += n
        self.sizes[self._seq] = size
        self.bytes += n
        self.last_bytes = n
        if self._refusing is not None:
            log.warning(
                "record journal %s takes records again; %d records were dropped meanwhile",
                self.slot,
                self.refused,
            )
            self._refusing, self.refused = None, 0
        return Position(self._seq, size)

    def _refuse(self, why: str) -> None:
        self.refused += 1
        if self._refusing is None:
            self._refusing = why
            log.error(
                "record journal %s refuses records, %s: they are dropped until the store"
                " takes the backlog",
                self.slot,
                why,
            )
        return None

    def _rotate(self) -> None:
        fd = self._create(self._seq + 1)
        os.close(self._fd)
        self._fd = fd
        self._seq += 1
        self.sizes[self._seq] = 0

    def _create(self, seq: int) -> int:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        return os.open(self._path(seq), flags, 0o600)  # records may hold captured texts

    def stored(self, upto: Position) -> list[int]:
        """Every record before ``upto`` is stored: forget the segments wholly before it
        (never the one being written) and return them, for ``delete``."""
        done = [seq for seq in self.sizes if seq < upto.seq and seq != self._seq]
        for seq in done:
            self.bytes -= self.sizes.pop(seq)
        return done

    # -- reading and deleting (the writer's thread) --------------------------------------
    def read(
        self, start: Position, ends: dict[int, int], n: int
    ) -> tuple[list[Record], int, Position]:
        """Up to ``n`` records from ``start`` on, never past ``ends`` (seq -> size, as the
        loop's thread recorded them). Returns the records, the lines consumed and where
        the next read starts. An unreadable line (half a line left by a crash mid-write,
        on an older journal) is skipped with a warning."""
        records: list[Record] = []
        lines = 0
        seq, offset = start
        seqs = sorted(ends)
        while len(records) < n:
            end = ends.get(seq, 0)
            if offset >= end:
                later = [s for s in seqs if s > seq]
                if not later:
                    break
                seq, offset = later[0], 0
                continue
            with open(self._path(seq), "rb") as f:
                f.seek(offset)
                while len(records) < n and offset < end:
                    line = f.readline(end - offset)
                    if not line:  # shorter than recorded: nothing more to find here
                        offset = end
                        break
                    offset += len(line)
                    if line.endswith(b"\n"):
                        lines += 1
                    try:
                        records.append(self._decoder.decode(line))
                    except msgspec.DecodeError:
                        log.warning("skipping an unreadable line in record journal %s", f.name)
        return records, lines, Position(seq, offset)

    def delete(self, seqs: list[int]) -> None:
        for seq in seqs:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(seq))

    def _path(self, seq: int) -> Path:
        assert self.slot is not None
        return self.slot / f"{seq:012d}{SUFFIX}"


def _raw(data: bytes | None) -> msgspec.Raw | None:
    return None if data is None else msgspec.Raw(data)


def _segments(slot: Path) -> list[tuple[int, Path]]:
    found = []
    for path in slot.iterdir():
        stem = path.name.removesuffix(SUFFIX)
        if path.name.endswith(SUFFIX) and stem.isdigit():
            found.append((int(stem), path))
    return sorted(found)


def _claim(root: Path) -> tuple[Path, int]:
    """The first slot ``root/<k>`` this process can lock, and the lock's descriptor."""
    for k in itertools.count():
        slot = root / str(k)
        fd = _lock(slot, create=True)
        if fd is not None:
            return slot, fd
    raise AssertionError("unreachable")


def _lock(slot: Path, *, create: bool) -> int | None:
    """Take the slot's lock without waiting: its descriptor, or None when a live process
    holds it (or, without ``create``, the slot is gone). Whoever empties a slot removes its
    lock file while holding it, so a lock taken on a file that is no longer there is
    let go and taken again."""
    path = slot / LOCK
    for _ in range(100):
        try:
            if create:
                slot.mkdir(exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            if not create:
                return None
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            st = os.stat(path)
            same = (st.st_dev, st.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
    raise OSError(f"cannot lock {path}: it keeps being removed")


def _remove_slot(slot: Path, fd: int) -> None:
    """Remove an emptied slot whose lock ``fd`` holds, then let the lock go."""
    with contextlib.suppress(OSError):
        os.unlink(slot / LOCK)
    with contextlib.suppress(OSError):
        slot.rmdir()  # only if nothing else is in it
    os.close(fd)
