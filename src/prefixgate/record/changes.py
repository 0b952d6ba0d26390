"""Prefix changes, found at capture time: each request against the previous request of its
session, and a session's first request against the previous session's first.

A prefix cache hits up to the first token that differs from what it holds. In an agent
session every request re-sends the previous one and appends; a segment that changes
between two consecutive requests (a clock in the system prompt, a nonce in a header block,
tools in another order, a schema serialized with other key order) makes everything after
it uncached, every turn. Finding it needs the previous request's text, which the store
does not keep (texts are opt-in): so the capture step keeps, in memory, the segment bytes
of each session's latest requests (:class:`ChangeTracker`, bounded by a byte budget,
least recently active session out first), compares the next request with them, and puts
on the record only *where* the prefix broke and the :class:`~.shape.Shape` of the change.

The upstream side decides whether the prefix broke (bytes as sent for an ``openai``
channel, whose template renders them as they are — JSON key order included; canonical
hashes for an ``anthropic`` one, whose ``cache_control`` markers move every turn); the
received side names what the client changed (``system[2]``, ``messages[1]:system``, a
tool) and gives the text the shape is computed from. The last two requests of a session
are kept, so a side request (a title, a sub-agent's turn) between two turns of the main
thread does not hide its breaks: the request is compared with both, and the one it shares
more with is its predecessor. A break after which nothing of the earlier request is sent
again costs nothing and is not recorded as a change.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import msgspec

from prefixgate.hygiene.markers import known_marker
from prefixgate.record import shape as sh
from prefixgate.record.compacted import COMPACTED, Marks, compacted, marks_of, rewritten
from prefixgate.record.cut import ChatCut, Pieces, pieces_of
from prefixgate.record.record import Change, Record, Segment
from prefixgate.record.segments import stripped
from prefixgate.sequences import common_prefix

BILLING_PREFIX = "x-anthropic-billing-header:"
DEFAULT_BUDGET = 64 * 1024 * 1024
MAX_SESSIONS = 20_000
KEPT = 2  # requests kept per session
# the details of a compaction's change (record/compacted.py): which step it is
RESTARTED = "the history restarted from a summary"
SUMMARY_REQUEST = "the client's summary request of a compaction"

Piece = tuple[Segment, bytes | None]
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.encode


class _Cut:
    """One request's segments with their bytes: as received (``into``) and as sent
    (``out``; bytes only where compared by bytes: tools and system on an ``openai``
    channel, messages by hash); ``lent``: the chat request the gateway built, as cut
    (:class:`~prefixgate.record.segments.ChatCut`), for the next turn's capture."""

    __slots__ = (
        "into", "out", "lent", "shared", "size", "by_bytes", "runs",
        "_into_bytes", "_out_bytes", "_tokens", "_marks",
    )  # fmt: skip
    _into_bytes: int  # the bytes of ``into``'s pieces
    _out_bytes: int  # and of ``out``'s

    def __init__(
        self,
        into: list[Piece],
        out: list[Piece],
        lent: ChatCut | None = None,
        *,
        shared: bool = False,
        base: _Cut | None = None,
        same: int = 0,
        runs: list[tuple[int, int]] | None = None,
        by_bytes: bool = False,
    ) -> None:
        """``shared``: ``out`` holds ``into``'s bytes (a request sent as it came).
        ``base``, ``same``: ``into``'s first ``same`` pieces are ``base.into``'s very
        ones, so its sums and marks go on from ``base``'s over the rest only; ``runs``:
        the (start, end) of ``out`` that are ``base.out``'s very pieces (likewise: the
        comparison with ``base`` passes them). ``base`` is not kept. ``by_bytes``:
        ``out`` was kept to be compared by bytes (an ``openai`` channel)."""
        self.into, self.out, self.lent, self.shared = into, out, lent, shared
        self.by_bytes = by_bytes
        self.runs = runs or []
        self._marks: Marks | None = None
        if base is not None and same:
            gone = base.into[same:]
            size: int = base._into_bytes - sum([len(d) for _, d in gone if d is not None])
            size += sum([len(d) for _, d in into[same:] if d is not None])
            if base._marks is not None:
                self._marks = _marks_on(base._marks, gone, into[same:])
        else:
            size = sum([len(d) for _, d in into if d is not None])
        self._into_bytes = size
        self._tokens: int | None = None
        if runs and base is not None:
            gone, new = _outside(base.out, runs), _outside(out, runs)
            sent = base._out_bytes - sum([len(d) for _, d in gone if d is not None])
            sent += sum([len(d) for _, d in new if d is not None])
            # the base's count (found once, the first of a session's chain: the turns
            # after it each go on from their predecessor's over their new pieces only)
            self._tokens = base.tokens() - sum([s.tokens for s, _ in gone])
            self._tokens += sum([s.tokens for s, _ in new])
        else:
            sent = sum([len(d) for _, d in out if d is not None])
        self._out_bytes = sent
        if not shared:
            size += sent
        self.size = size + 64 * (len(into) + len(out)) + (lent.size if lent else 0)

    def marks(self) -> Marks:
        """The request's compaction marks as received (found once, then kept)."""
        if self._marks is None:
            self._marks = marks_of(_segs(self.into))
        return self._marks

    def tokens(self) -> int:
        """≈ tokens of the request as sent."""
        if self._tokens is None:
            self._tokens = sum([s.tokens for s, _ in self.out])
        return self._tokens

    def opening(self) -> _Cut:
        """Only what comes before the conversation: tools and system."""
        return _Cut(
            [p for p in self.into if p[0].kind != "message"],
            [p for p in self.out if p[0].kind != "message"],
            shared=self.shared,
        )


class ChangeTracker:
    """The sessions' latest requests, by (channel, upstream model, session), within
    ``budget`` bytes; and the latest session opening per (channel, upstream model,
    client, version, endpoint)."""

    def __init__(self, budget: int = DEFAULT_BUDGET, max_sessions: int = MAX_SESSIONS) -> None:
        self.budget = budget
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[tuple, list[_Cut]] = OrderedDict()
        self._openings: OrderedDict[tuple, _Cut] = OrderedDict()
        self.bytes = 0
        # each request's cut, sums and comparison go on from the previous one's (False:
        # each walks the whole request, as a check of the results)
        self.go_on = True

    def observe(
        self,
        rec: Record,
        channel: str,
        upstream_model: str | None,
        raw_in: bytes,
        raw_out: bytes | None,
        *,
        by_bytes: bool,
        pieces_in: list[tuple[Segment, bytes]] | None = None,
        pieces_out: list[tuple[Segment, bytes]] | None = None,
        lent: ChatCut | None = None,
        summary: bool = False,
    ) -> None:
        """Compare ``rec`` (its segments already captured) with its session's previous
        requests; set ``rec.compared`` and ``rec.change``; keep it for the next.
        ``pieces_in`` / ``pieces_out``: the segments' bytes when the capture cut them
        already (else they are cut here from ``raw_in`` / ``raw_out``); ``lent``: the chat
        request as cut, kept for the next turn's capture to borrow from; ``summary``: the
        client named the request a compaction's summary request
        (:func:`~prefixgate.record.compacted.summary_request`)."""
        if rec.session_id is None or not rec.segments_in or not rec.segments_out:
            return
        into = pieces_in if pieces_in is not None else pieces_of(raw_in, rec.segments_in)
        if into is None:
            return
        if raw_out is None:
            out_full: list[tuple[Segment, bytes]] | None = into
        elif pieces_out is not None:
            out_full = pieces_out
        else:
            out_full = pieces_of(raw_out, rec.segments_out)
        if out_full is None:
            return
        key = (channel, upstream_model, rec.session_id)
        kept = self._sessions.pop(key, None)
        same = 0  # how many leading pieces of ``into`` are the latest request's very ones
        if isinstance(into, Pieces):
            if kept and into.base is kept[-1].into and self.go_on:
                same = into.same
            into.base, into.same = None, 0
        if kept:
            _share(kept[-1].into, into, same)  # before ``out`` may take the same bytes
        runs: list[tuple[int, int]] = []  # pieces sent as the latest request's very ones
        if isinstance(out_full, Pieces) and out_full is not into:
            if (
                kept
                and out_full.base is kept[-1].lent
                and kept[-1].by_bytes == by_bytes
                and self.go_on
            ):
                runs = out_full.runs
            out_full.base, out_full.runs = None, []
        prev_out = kept[-1].out if kept else ()
        out = _sent(into if raw_out is None else out_full, by_bytes, prev_out, runs)
        if kept:
            cur = _Cut(
                into, out, lent, shared=raw_out is None, base=kept[-1], same=same, runs=runs,
                by_bytes=by_bytes,
            )  # fmt: skip
            rec.compared = "session"
            rec.change = _best(kept, cur, summary)
            self.bytes -= sum(c.size for c in kept)
            kept = [*kept, cur][-KEPT:]
        else:
            cur = _Cut(into, out, lent, shared=raw_out is None, by_bytes=by_bytes)
            kept = [cur]
            okey = (channel, upstream_model, rec.client, rec.client_version, rec.endpoint)
            opened = self._openings.pop(okey, None)
            if opened is not None:
                self.bytes -= opened.size
                rec.compared = "sessions"
                rec.change = compare(opened, cur.opening(), "sessions", whole=cur)
            opening = cur.opening()
            self._openings[okey] = opening
            self.bytes += opening.size
        self._sessions[key] = kept
        self.bytes += sum(c.size for c in kept)
        self._evict()

    def latest(self, channel: str, upstream_model: str | None, session: str) -> _Cut | None:
        """The session's latest request as kept (its pieces as received: ``.into``)."""
        kept = self._sessions.get((channel, upstream_model, session))
        return kept[-1] if kept else None

    def _evict(self) -> None:
        while self._sessions and (
            self.bytes > self.budget or len(self._sessions) > self.max_sessions
        ):
            _, old = self._sessions.popitem(last=False)
            self.bytes -= sum(c.size for c in old)
        while self._openings and (self.bytes > self.budget or len(self._openings) > 1024):
            _, old_opening = self._openings.popitem(last=False)
            self.bytes -= old_opening.size

    def __len__(self) -> int:
        return len(self._sessions)


def _outside(pieces: list[Piece], runs: list[tuple[int, int]]) -> list[Piece]:
    """The pieces outside the (start, end) runs (sorted, apart)."""
    out: list[Piece] = []
    at = 0
    for a, b in runs:
        out += pieces[at:a]
        at = b
    out += pieces[at:]
    return out


def _sent(
    pieces: list,
    by_bytes: bool,
    prev: list[Piece] | tuple,
    runs: list[tuple[int, int]] | tuple = (),
) -> list[Piece]:
    """What is kept of the pieces as sent: bytes only where compared by bytes (not the
    messages), and the previous request's very piece where it is the same (the same
    segment and bytes: one copy kept, and the comparison passes it by identity).
    ``runs``: the (start, end) where ``pieces`` are the very pieces ``prev`` was kept
    of, which give what ``prev`` holds there (taken as slices)."""
    if runs:
        # ``prev`` up to the last run's end, the gaps before each run made in their place
        # (one for one: of the same length), then the rest
        end = runs[-1][1]
        out = prev[:end] if isinstance(prev, list) else list(prev[:end])
        at = 0
        for a, b in runs:
            out[at:a] = _sent(pieces[at:a], by_bytes, prev[at:a])
            at = b
        out += _sent(pieces[end:], by_bytes, prev[end:])
        return out
    out = []
    n = len(prev)
    for j, (s, d) in enumerate(pieces):
        if not by_bytes or s.kind == "message":
            d = None
        if j < n:
            p = prev[j]
            sa, ba = p
            same = sa is s or (sa.hash == s.hash and sa.name == s.name and sa.kind == s.kind)
            if same and (ba is d or (ba is not None and d is not None and ba == d)):
                out.append(p if sa is s else (s, ba))
                continue
        out.append((s, d))
    return out


def _marks_on(base: Marks, gone: list[Piece], new: list[Piece]) -> Marks | None:
    """The marks of a request that is ``base``'s with the pieces ``gone`` replaced by
    ``new`` (:func:`marks_of` of the whole, from the two tails); None when a compaction
    item left (found again from the whole, when asked)."""
    a, b = marks_of(_segs(gone)), marks_of(_segs(new))
    if a.compactions:  # a compaction item left: counted again from the whole
        return None
    return Marks(base.model_turns - a.model_turns + b.model_turns, base.compactions | b.compactions)


def _share(prev: list[Piece], cur: list[Piece], start: int = 0) -> None:
    """Where ``cur`` holds the very bytes ``prev`` does, keep one copy (``cur``'s first
    ``start`` pieces are ``prev``'s already)."""
    for j in range(start, min(len(prev), len(cur))):
        if prev[j] is cur[j]:  # lent by the cut already
            continue
        (sa, ba), (sb, bb) = prev[j], cur[j]
        if sa.hash == sb.hash and ba is not None and ba == bb:
            cur[j] = (sb, ba)


def _best(kept: list[_Cut], cur: _Cut, summary: bool = False) -> Change | None:
    """The change against the kept request ``cur`` shares the most tokens with (its
    predecessor in the same thread of the session); a compaction's when ``cur`` is its
    summary request, or rewrites that predecessor's or the latest request's history."""
    found = [(_sharing(prev, cur, kept), prev) for prev in kept]
    (shared, i, _), prev = max(found, key=lambda x: x[0][0])
    latest = kept[-1]
    if summary:
        why: str | None = SUMMARY_REQUEST
    elif compacted(prev.marks(), cur.marks()) or (
        latest is not prev
        and rewritten(latest.marks(), _segs(latest.out), cur.marks(), _segs(cur.out))
    ):
        why = RESTARTED
    else:
        why = None
    return compare(prev, cur, "session", compaction=why, at=i)


def _segs(pieces: list[Piece]) -> Iterator[Segment]:
    """The pieces' segments, for a walk that lists them itself if it needs them twice."""
    return (s for s, _ in pieces)


def _sharing(prev: _Cut, cur: _Cut, kept: list[_Cut] | None = None) -> tuple[int, int | None, int]:
    """(≈ tokens of ``cur`` that ``prev`` had sent, the index where it breaks, …).
    ``kept``: the session's kept requests, ``cur``'s ``runs`` against the latest one,
    whose own are against the one before it."""
    runs: list[tuple[int, int]] = []
    if kept and prev is kept[-1]:
        runs = cur.runs
    elif kept and len(kept) > 1 and prev is kept[-2]:
        runs = _both(cur.runs, kept[-1].runs)
    i = _first_difference(prev.out, cur.out, runs)
    if i is None:
        return prev.tokens(), None, 0
    at, lost, _ = _break(prev, cur, i)
    return at + lost, i, lost


def _both(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Where two lists of (start, end) runs (each sorted, apart) overlap."""
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _first_difference(
    prev: list[Piece], cur: list[Piece], runs: list[tuple[int, int]] | tuple = ()
) -> int | None:
    """The first index where the pieces differ (None: one list is the other's start);
    ``runs``: where ``cur`` holds ``prev``'s very pieces (passed without a look)."""
    n = min(len(prev), len(cur))
    at = 0
    for a, b in runs:
        found = _first_difference(prev[at:a], cur[at:a]) if a > at else None
        if found is not None:
            return at + found
        at = b
        if at >= n:
            return None
    if at:
        found = _first_difference(prev[at:n], cur[at:n])
        return None if found is None else at + found
    for i in range(n):
        a, b = prev[i], cur[i]
        if a is b:  # the very piece (``_sent``): the same segment and bytes
            continue
        (sa, ba), (sb, bb) = a, b
        if sa.name != sb.name or sa.kind != sb.kind or sa.hash != sb.hash:
            return i
        if ba is not None and bb is not None and ba != bb:
            return i
    return None


def _break(prev: _Cut, cur: _Cut, i: int) -> tuple[int, int, int]:
    """At break ``i``: ≈ tokens before it, ≈ tokens after it sent before too, and the
    characters of the broken piece that came before the difference."""
    (sa, ba), (sb, bb) = prev.out[i], cur.out[i]
    within = suffix = 0
    if ba is not None and bb is not None and sa.name == sb.name:
        within = common_prefix(ba, bb)
        suffix = sh.common_suffix(ba, bb, min(len(ba), len(bb)) - within)
    before = sum(s.tokens for s, _ in cur.out[:i])
    sent = {s.hash for s, _ in prev.out}
    lost = suffix // 4 + sum(s.tokens for s, _ in cur.out[i + 1 :] if s.hash in sent)
    return before + within // 4, lost, within


_UNKNOWN = -1


def compare(
    prev: _Cut,
    cur: _Cut,
    scope: str,
    *,
    whole: _Cut | None = None,
    compaction: str | None = None,
    at: int | None = _UNKNOWN,
) -> Change | None:
    """Where ``cur`` stops extending ``prev`` upstream, and what changed (None when it
    extends it, or when nothing after the break had been sent before: no loss; but a
    compaction, ``compaction`` saying which step, is always said, loss or not: the record
    shows the restart). ``at``: the first difference of their pieces as sent, when the
    caller found it."""
    i = _first_difference(prev.out, cur.out) if at == _UNKNOWN else at
    if i is None:
        return None
    at, lost, _ = _break(prev, cur, i)
    if lost <= 0 and compaction is None:
        return None
    sb = _broken(prev.out, cur.out, i)
    segment, kind, shape, known = _culprit(prev.into, cur.into, sb)
    if compaction is not None:
        # a compaction restarts the context wherever the client rewrote it (Codex re-sends
        # its instructions in another order, Claude Code's billing header changes with it)
        shape = sh.Shape(cls=COMPACTED, detail=compaction)
    full = whole if whole is not None else cur
    return Change(
        scope=scope,
        cls=shape.cls,
        segment=segment,
        upstream=sb.name,
        kind=kind,
        at_tokens=at,
        lost_tokens=lost,
        prompt_estimate=sum(s.tokens for s, _ in full.out) or 1,
        shape=shape,
        known=known,
    )


def _broken(prev: list[Piece], cur: list[Piece], i: int) -> Segment:
    """The upstream segment that broke at ``i``: a tool where either request has one
    there (tools left out or added: the next segment of the other is not what changed)."""
    sa, sb = prev[i][0], cur[i][0]
    return sa if sb.kind != "tool" and sa.kind == "tool" else sb


def _culprit(
    prev: list[Piece], cur: list[Piece], broke: Segment
) -> tuple[str, str, sh.Shape, str | None]:
    """The received segment that changed, of the kind of the upstream one that broke:
    (its name, its kind, the shape of its change, a known source)."""
    kind = broke.kind
    a = [p for p in prev if p[0].kind == kind]
    b = [p for p in cur if p[0].kind == kind]
    if kind == "tool":
        ha, hb = [s.hash for s, _ in a], [s.hash for s, _ in b]
        if ha != hb and sorted(ha) == sorted(hb):
            return "tools", "tools", sh.reordered_list(len(hb), "tools"), None
        if not a or not b:
            what = f"{len(b)} tools added" if b else f"{len(a)} tools left out"
            return "tools", "tools", sh.Shape(cls=sh.CONTENT, detail=what), None
    for (sa, ba), (sb, bb) in zip(a, b, strict=False):
        if sa.hash != sb.hash or sa.name != sb.name:
            return sb.name, kind, _text_shape(ba, bb, kind), _known(bb, kind)
    for (_, ba), (sb, bb) in zip(a, b, strict=False):
        if ba is not None and bb is not None and ba != bb and not _marker_only(ba, bb):
            return sb.name, kind, sh.json_shape(ba, bb, same_value=True), _known(bb, kind)
    if len(a) != len(b):
        what = "added" if len(b) > len(a) else "removed"
        name = b[len(a)][0].name if len(b) > len(a) else a[len(b)][0].name
        return name, kind, sh.Shape(cls=sh.CONTENT, detail=f"{kind} {what}"), None
    return broke.name, kind, sh.Shape(cls=sh.CONTENT, detail="changed upstream only"), None


def _marker_only(a: bytes, b: bytes) -> bool:
    """Whether two JSON pieces differ only by their ``cache_control`` markers."""
    try:
        return _encode(stripped(_decode(a))) == _encode(stripped(_decode(b)))
    except (msgspec.DecodeError, RecursionError):
        return False


def _text_shape(a: bytes | None, b: bytes | None, kind: str) -> sh.Shape:
    if a is None or b is None:
        return sh.Shape(cls=sh.CONTENT)
    try:
        va, vb = _decode(a), _decode(b)
    except (msgspec.DecodeError, RecursionError):
        return sh.json_shape(a, b, same_value=False)
    if kind == "tool":
        ta, tb = a.decode("utf-8", "replace"), b.decode("utf-8", "replace")
        if stripped(va) == stripped(vb):
            return sh.json_shape(a, b, same_value=True)
    else:
        ta, tb = text_of(va), text_of(vb)
    found = sh.shape_of(ta, tb)
    if found is None:
        return sh.json_shape(a, b, same_value=stripped(va) == stripped(vb))
    return found


def text_of(value: Any) -> str:
    """The human text of a system block, a message or a content block (JSON of what has
    none: a tool call's input)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(text_of(v) for v in value)
    if isinstance(value, dict):
        text = value.get("text")
        if isinstance(text, str):
            return text
        if "content" in value and value["content"] is not None:
            return text_of(value["content"])
        if "thinking" in value and isinstance(value["thinking"], str):
            return value["thinking"]
        return _encode(value).decode()
    return _encode(value).decode()


def _known(data: bytes | None, kind: str) -> str | None:
    """The catalogued client marker (``hygiene/markers.py``) in a changed system segment."""
    if kind != "system" or data is None:
        return None
    if BILLING_PREFIX.encode() not in data[:200] and b"<total_tokens>" not in data:
        return None
    try:
        text = text_of(_decode(data))
    except (msgspec.DecodeError, RecursionError):
        return None
    return known_marker(text)


__all__ = ["ChangeTracker", "compare", "text_of"]
