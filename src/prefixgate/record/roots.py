"""The segment lists of a session's records stored as a difference to a root record.

A session's prompt grows at its tail: turn 60 holds the 58 messages of turn 59 and two
more. Written whole, every record's two segment lists (~150 segments each, 11-13 KB of
JSON at turn 60) cost the journal's line, the store's row and its pages about a tenth of
a millisecond a turn, growing with the session (docs/performance.md). So the record writer stores a session's record
as the first ``keep`` segments of its session's *root* record (a record stored whole)
plus the record's own tail (:class:`~prefixgate.record.record.SegmentsRoot`).

The shape is a star, never a chain: a root is always stored whole, so any record reads
back with its own row and its root's (``store/lists.py``). A record becomes the
session's new root when it shares nothing with the current one (a compaction, a new
system prompt) or when its tails would exceed a quarter of its lists: the rows written
per turn stay a small share of the lists however long the session runs, and a reader
never fetches more than one other row.

What is kept per session (bounded by sessions and by segments in all, least recently
used first out): the root's ``request_id`` and its two lists, the very segment objects
(the capture hands the next turn the same objects for an unchanged prefix, so the
comparison, in C, is mostly ``is``). Memory of this process only: another worker or
gateway starts its own roots; a restart starts afresh (the first record of each session
stored whole again).

A root the store never gets (the journal refusing it; the store refusing its data) is
forgotten here (:meth:`SegmentRoots.forget`), so no later record builds on it. Should a
root still be missing when read (a machine crash losing the journal's unflushed tail),
the records built on it read back without segment lists; nothing else is lost.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import msgspec

from prefixgate.record.record import Record, Segment, SegmentsRoot
from prefixgate.sequences import common_prefix

MAX_SESSIONS = 10_000
# Segments the roots' lists hold in all (a Segment with its strings is ~200 bytes; most
# are the very objects the change memory holds too): past it, least recent roots out.
MAX_SEGMENTS = 400_000
# A record is stored as a difference while its tails are at most this share of its lists.
MAX_TAIL_SHARE = 0.25


class _Root(NamedTuple):
    request_id: str
    segments_in: list[Segment]
    segments_out: list[Segment] | None  # None: the same as segments_in


class SegmentRoots:
    """Per session, the root record the next records' stored lists extend. Owned by the
    record writer, used from the event loop's thread only."""

    def __init__(self, max_sessions: int = MAX_SESSIONS, max_segments: int = MAX_SEGMENTS) -> None:
        self.max_sessions = max_sessions
        self.max_segments = max_segments
        self.segments = 0  # the roots' lists' segments, in all
        self._roots: OrderedDict[str, _Root] = OrderedDict()

    def __len__(self) -> int:
        return len(self._roots)

    def stored(self, record: Record) -> Record:
        """The record as it is to be stored: itself (stored whole, and now its session's
        root), or a copy whose lists are its tails after its root's, with
        ``segments_root`` saying whose and how many. The record itself is not changed."""
        sid, seg_in, seg_out = record.session_id, record.segments_in, record.segments_out
        if sid is None or seg_in is None or seg_out is None or record.segments_root is not None:
            return record  # stored whole (nothing went upstream: nothing to build on)
        same = seg_out is seg_in or seg_out == seg_in
        root = self._roots.get(sid)
        if root is not None:
            keep_in = common_prefix(root.segments_in, seg_in)
            whole = len(seg_in)
            tails = whole - keep_in
            keep_out = -1
            if not same:
                root_out = root.segments_in if root.segments_out is None else root.segments_out
                keep_out = common_prefix(root_out, seg_out)
                whole += len(seg_out)
                tails += len(seg_out) - keep_out
            if keep_in > 0 and tails <= MAX_TAIL_SHARE * whole:
                self._roots.move_to_end(sid)
                return msgspec.structs.replace(
                    record,
                    segments_in=seg_in[keep_in:],
                    segments_out=None if same else seg_out[keep_out:],
                    segments_root=SegmentsRoot(root.request_id, keep_in, keep_out),
                )
        self._drop(sid)
        root = _Root(record.request_id, seg_in, None if same else seg_out)
        self._roots[sid] = root
        self.segments += _size(root)
        while len(self._roots) > self.max_sessions or (
            self.segments > self.max_segments and len(self._roots) > 1
        ):
            self._drop(next(iter(self._roots)))
        return record

    def forget(self, record: Record) -> None:
        """``record`` (as :meth:`stored` gave it) will not be stored: if it is its
        session's root, the session has none now."""
        sid = record.session_id
        if sid is None:
            return
        root = self._roots.get(sid)
        if root is not None and root.request_id == record.request_id:
            self._drop(sid)

    def _drop(self, sid: str) -> None:
        root = self._roots.pop(sid, None)
        if root is not None:
            self.segments -= _size(root)


def _size(root: _Root) -> int:
    return len(root.segments_in) + (0 if root.segments_out is None else len(root.segments_out))
