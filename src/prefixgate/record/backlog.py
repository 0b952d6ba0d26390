"""What the record writer has yet to store, in order: the journal, or (without one) a
bounded queue in memory.

The writer asks a backlog for the next batch, stores it, and commits it. A batch comes
from memory when it can: the journal keeps the records of its tail in memory as well (up
to ``mirror_max`` records and ``MIRROR_BYTES``), so in the steady state nothing is read back from disk and decoded
again (a Claude Code record decodes in tens of microseconds). When the tail outgrows
that bound (the store is down or slow), the copies in memory are dropped and batches are
read from the journal's files until the reader has caught up with the end; then the tail
is mirrored again. A backlog a previous run left is read from the files the same way: one
path for a restart, an outage and a burst.

``append``, ``take``, ``snapshot``, ``commit`` and ``close`` run on the event loop's
thread; ``open``, ``load`` and ``delete`` in the writer's worker thread.
"""

from __future__ import annotations

import collections
import itertools
import os
from typing import NamedTuple

from prefixgate.record.journal import Journal, Position, SegmentsJson
from prefixgate.record.record import Record

# The mirrored tail's bound in encoded bytes, besides its count (records carrying captured
# texts can be large).
MIRROR_BYTES = 32 << 20


class Batch(NamedTuple):
    records: list[Record]
    count: int  # entries it takes off the backlog (unreadable journal lines included)
    end: Position | None  # where the next batch starts
    memory: bool  # taken from memory (the head of the mirror or of the queue)
    # each record's segment lists as the journal encoded them, for the store's rows
    # (None: not at hand, the rows encode them)
    segments: list[SegmentsJson] | None = None


class MemoryBacklog:
    """No journal: records wait in memory, at most ``max_records``; a crash loses them."""

    where = "memory"

    def __init__(self, max_records: int) -> None:
        self.max_records = max_records
        self._queue: collections.deque[Record] = collections.deque()

    @property
    def pending(self) -> int:
        return len(self._queue)

    @property
    def bytes(self) -> int:
        return 0

    def open(self) -> int:
        return len(self._queue)

    def append(self, record: Record) -> bool:
        if len(self._queue) >= self.max_records:
            return False
        self._queue.append(record)
        return True

    def take(self, n: int) -> Batch:
        records = list(itertools.islice(self._queue, n))
        return Batch(records, len(records), None, True)

    def snapshot(self) -> dict[int, int]:
        return {}

    def load(self, n: int, ends: dict[int, int]) -> Batch:  # pragma: no cover - take serves
        raise AssertionError("a memory backlog is never loaded")

    def commit(self, batch: Batch) -> list[int]:
        for _ in range(batch.count):
            self._queue.popleft()
        return []

    def delete(self, seqs: list[int]) -> None:
        pass

    def close(self) -> int:
        """Returns the records that were never stored (lost with the process)."""
        n = len(self._queue)
        self._queue.clear()
        return n


class JournalBacklog:
    """The journal, with its tail mirrored in memory while it is short."""

    def __init__(self, journal: Journal, mirror_max: int) -> None:
        self.journal = journal
        self.mirror_max = mirror_max
        self.where = str(journal.root)
        self.pending = 0  # records appended and not yet stored (estimated for a backlog)
        self._cursor = Position(0, 0)  # the first byte not yet stored
        # each: the record, its end in the journal, its line's size, its segments' JSON
        self._mirror: collections.deque[tuple[Record, Position, int, SegmentsJson | None]] = (
            collections.deque()
        )
        self._mirror_bytes = 0
        # The mirror holds exactly the records from the cursor to the journal's end.
        self._in_sync = False

    @property
    def bytes(self) -> int:
        return self.journal.bytes

    def open(self) -> int:
        if not self.journal.is_open:
            self.pending = self.journal.open()
            self._cursor = self.journal.start()
            self._in_sync = self._cursor == self.journal.end
        return self.pending

    def append(self, record: Record) -> bool:
        if not self.journal.is_open:
            self.open()  # submitted before the writer started
        end = self.journal.append(record)
        if end is None:
            return False
        self.pending += 1
        if self._in_sync:
            n = self.journal.last_bytes
            if len(self._mirror) < self.mirror_max and self._mirror_bytes + n <= MIRROR_BYTES:
                self._mirror.append((record, end, n, self.journal.last_segments))
                self._mirror_bytes += n
            else:  # too far behind to keep in memory: read it back from the files later
                self._in_sync = False
                self._mirror.clear()
                self._mirror_bytes = 0
        return True

    def take(self, n: int) -> Batch | None:
        """The next batch from memory, or None when it must be loaded from the files."""
        if not self._in_sync:
            return None
        head = list(itertools.islice(self._mirror, n))
        end = head[-1][1] if head else self._cursor
        segments = [s for _, _, _, s in head]
        return Batch(
            [r for r, _, _, _ in head],
            len(head),
            end,
            True,
            segments if None not in segments else None,  # type: ignore[arg-type]
        )

    def snapshot(self) -> dict[int, int]:
        return dict(self.journal.sizes)

    def load(self, n: int, ends: dict[int, int]) -> Batch:
        records, lines, end = self.journal.read(self._cursor, ends, n)
        return Batch(records, lines, end, False)

    def commit(self, batch: Batch) -> list[int]:
        """The batch is stored: move past it; returns the segments now wholly stored."""
        if batch.memory and self._in_sync:
            for _ in range(batch.count):
                self._mirror_bytes -= self._mirror.popleft()[2]
        assert batch.end is not None
        self._cursor = batch.end
        self.pending = max(0, self.pending - batch.count)
        if not self._in_sync and self._cursor == self.journal.end:
            self._in_sync, self.pending = True, 0  # caught up: mirror the tail again
        return self.journal.stored(self._cursor)

    def delete(self, seqs: list[int]) -> None:
        self.journal.delete(seqs)

    def close(self) -> int:
        """Returns the records that were never stored (they stay in the journal)."""
        done = self._cursor == self.journal.end
        self.journal.close(everything_stored=done)
        self._mirror.clear()
        self._mirror_bytes = 0
        return 0 if done else self.pending


def open_backlog(
    journal_path: str | os.PathLike[str] | None,
    *,
    max_records: int,
    max_bytes: int,
    segment_bytes: int = 0,
) -> MemoryBacklog | JournalBacklog:
    """The journal at ``journal_path`` (opened later, by the writer), or None: memory."""
    if journal_path is None:
        return MemoryBacklog(max_records)
    journal = Journal(journal_path, max_bytes=max_bytes, segment_bytes=segment_bytes)
    return JournalBacklog(journal, max_records)
