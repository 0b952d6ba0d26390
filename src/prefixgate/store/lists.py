"""A record's segment lists as read from the store: whole, whichever way they were stored.

A row holds its lists whole, or (``segments_root`` set) as the tails after the first
``segments_in_keep`` / ``segments_out_keep`` segments of its session's root record, a
row stored whole (``record/roots.py``). Every reader of the lists reads them through
this module: select :data:`SELECT`'s six columns, and :func:`whole` gives each row's
two lists, fetching the roots the rows name in one query. In SQL alone, a row's whole
``segments_in`` is its root's first ``segments_in_keep`` elements followed by its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import msgspec

from prefixgate.record.record import Record, Segment

# The columns :func:`whole` reads, in its order.
SELECT = (
    "segments_in, segments_out, segments_out_same, segments_root, segments_in_keep,"
    " segments_out_keep"
)
WIDTH = 6

Lists = tuple[list[Segment] | None, list[Segment] | None]

_DECODER = msgspec.json.Decoder(list[Segment])
_CHUNK = 500


class _Queries(Protocol):
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...


def decode(value: Any) -> list[Segment] | None:
    """A segment-list column as read: JSON text (SQLite, or Postgres cast to text) or
    JSON a driver decoded (Postgres' ``jsonb``)."""
    if value is None:
        return None
    if isinstance(value, str | bytes):
        return _DECODER.decode(value)
    return [Segment(*item) for item in value]


def _own(row: Sequence[Any]) -> Lists:
    """A row's lists as it holds them (whole, or its tails)."""
    seg_in = decode(row[0])
    if row[2] and seg_in is not None:
        return seg_in, seg_in
    return seg_in, decode(row[1])


def roots(store: _Queries, ids: Iterable[str]) -> dict[str, Lists]:
    """The whole lists of the root records ``ids`` (those the store holds)."""
    wanted = list(dict.fromkeys(ids))
    out: dict[str, Lists] = {}
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i : i + _CHUNK]
        marks = ", ".join(["?"] * len(chunk))
        for rid, *row in store.query(
            "SELECT request_id, segments_in, segments_out, segments_out_same FROM requests"
            f" WHERE request_id IN ({marks})",
            chunk,
        ):
            out[rid] = _own(row)
    return out


def joined(base: Lists, tails: Lists, keep_in: int, keep_out: int) -> Lists:
    """A record's whole lists from its root's and its own tails (``keep_out`` -1: its
    ``segments_out`` is its ``segments_in``). A root too short for the keep (never
    written so) reads as unknown: ``(None, None)``."""
    root_in, root_out = base
    tail_in, tail_out = tails
    if root_in is None or tail_in is None or keep_in > len(root_in):
        return None, None
    seg_in = root_in[:keep_in] + tail_in
    if keep_out < 0:
        return seg_in, seg_in
    if root_out is None or tail_out is None or keep_out > len(root_out):
        return seg_in, None
    return seg_in, root_out[:keep_out] + tail_out


def whole(store: _Queries, rows: Sequence[Sequence[Any]]) -> list[Lists]:
    """Each row's two lists, whole; ``rows``: :data:`SELECT`'s columns, in its order. A
    row whose root the store no longer holds reads as ``(None, None)``."""
    ids = [row[3] for row in rows if row[3] is not None]
    found = roots(store, ids) if ids else {}
    out: list[Lists] = []
    for row in rows:
        own = _own(row)
        rid = row[3]
        if rid is None:
            out.append(own)
            continue
        base = found.get(rid)
        keep_in, keep_out = int(row[4] or 0), int(row[5] if row[5] is not None else -1)
        out.append((None, None) if base is None else joined(base, own, keep_in, keep_out))
    return out


def whole_records(store: _Queries, records: Sequence[Record]) -> None:
    """Records read from rows (``store/schema.py``'s ``row_record``) given their whole
    lists in place: those stored as a difference get their root's prefix."""
    ids = [r.segments_root.request_id for r in records if r.segments_root is not None]
    if not ids:
        return
    found = roots(store, ids)
    for r in records:
        root = r.segments_root
        if root is None:
            continue
        base = found.get(root.request_id)
        own = (r.segments_in, r.segments_out)
        lists = (None, None) if base is None else joined(base, own, root.keep_in, root.keep_out)
        r.segments_in, r.segments_out = lists
        r.segments_root = None
