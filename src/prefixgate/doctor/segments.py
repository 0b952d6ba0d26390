"""Segments: which part of the prompt changes, where it sits, what varies inside it, and
which known cause it is.

Works on the captured segment lists of a slice's requests (see
:mod:`prefixgate.record.segments`). Consecutive requests of one session should extend each
other; the first segment in UPSTREAM order (``segments_out``) where they do not is where
the prefix cache stopped hitting, and the estimated tokens before it should match a
pinned cached constant. The same segment in the request as received (``segments_in``)
names the cause: Claude Code's billing header at ``system[0]``, a hoisted mid-conversation
system message, a timestamp, reordered tools, a compaction boundary, or "unknown" (with
the diff). Texts, when captured, show what varies (``cch=8c7f0 → 7ee55``).

Volatility: *per-request* (changes within a session, every turn: nothing after it is ever
reused) or *per-session* (stable within a session, different across sessions: sessions
cannot share the tools + system prefix).
"""

from __future__ import annotations

import difflib
import json
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from prefixgate.doctor import query
from prefixgate.record.compacted import COMPACTED, compacted
from prefixgate.record.record import Segment
from prefixgate.record.segments import first_changed, prefix_tokens
from prefixgate.store import Store, lists

BILLING_PREFIX = "x-anthropic-billing-header:"
CLAUDE_CLIENTS = ("claude-cli", "claude-code")
SAMPLE_LIMIT = 4000  # most recent captured requests of a slice to read
MATCH_TOLERANCE = 0.15

# cause names
BILLING = "billing_header"
HOISTED = "hoisted_system_message"
TIMESTAMP = "timestamp"
REORDERED = "reordered_tools"
TOOLS_CHANGED = "tools_changed"
COMPACTION = "compaction"
UNKNOWN = "unknown"

PER_REQUEST = "per-request"
PER_SESSION = "per-session"
OCCASIONAL = "occasional"

_DATE_TIME = re.compile(
    r"\d{4}-\d{1,2}-\d{1,2}(?:[ T]\d{1,2}:\d{2}(?::\d{2})?)?"
    r"|\d{1,2}:\d{2}:\d{2}"
    r"|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*,? \w+ \d{1,2}"
    r"|\b1[6-9]\d{8}(?:\.\d+)?\b"
)
_WORD = re.compile(r"\w+|\s+|[^\w\s]")


@dataclass
class Captured:
    request_id: str
    session_id: str | None
    received_at: float
    client: str | None
    session_kind: str | None
    prompt_tokens: int
    cached_tokens: int
    seg_in: list[Segment]
    seg_out: list[Segment]
    captured: bool
    change_class: str | None = None  # the record's (record/changes.py)

    @property
    def claude(self) -> bool:
        return (self.client or "") in CLAUDE_CLIENTS or self.session_kind == "claude-code"


# ``Store.get_texts``: the stored texts of some segment hashes, by hash.
TextsOf = Callable[[Iterable[str]], dict[str, str]]


def load(
    store: Store,
    filters: Sequence[tuple[str, str | None]],
    since: float | None = None,
    until: float | None = None,
    limit: int = SAMPLE_LIMIT,
) -> list[Captured]:
    """The most recent ``limit`` captured successful requests of a slice, oldest first."""
    where, params = query.window(since, until)
    for column, value in filters:
        s, p = query.equals(column, value)
        where += s
        params += p
    sql = (
        "SELECT request_id, session_id, received_at, client, session_kind, prompt_tokens,"
        f" COALESCE(cached_tokens, 0), captured, change_class, {lists.SELECT}"
        f" FROM requests WHERE {query.OK} AND segments_in IS NOT NULL{where}"
        f" ORDER BY received_at DESC, id DESC LIMIT {int(limit)}"
    )
    out = []
    rows = query.run(store, sql, params)[::-1]
    for row, (s_in, s_out) in zip(rows, lists.whole(store, [r[9:] for r in rows]), strict=True):
        rid, sid, at, client, kind, prompt, cached, captured, cls = row[:9]
        if s_in is None:
            continue  # stored as a difference to a root the store no longer holds
        out.append(
            Captured(
                rid,
                sid,
                float(at),
                client,
                kind,
                int(prompt),
                int(cached),
                s_in,
                s_out if s_out is not None else s_in,
                bool(captured),
                cls,
            )
        )
    return out


def sessions(reqs: Sequence[Captured]) -> dict[str, list[Captured]]:
    by: dict[str, list[Captured]] = defaultdict(list)
    for r in reqs:
        if r.session_id is not None:
            by[r.session_id].append(r)
    for lst in by.values():
        lst.sort(key=lambda r: r.received_at)
    return dict(by)


# -- texts ------------------------------------------------------------------------------


def plain_text(stored: str) -> str:
    """The human text inside a stored canonical-JSON segment."""
    try:
        obj = json.loads(stored)
    except ValueError:
        return stored
    if isinstance(obj, str):
        return obj
    if isinstance(obj, dict):
        for key in ("text", "content"):
            v = obj.get(key)
            if isinstance(v, str):
                return v
            if isinstance(v, list):
                return "".join(b.get("text", "") for b in v if isinstance(b, dict))
    return stored


def diff_texts(a: str, b: str, *, context: int = 8, limit: int = 3) -> str:
    """A short word-level diff: the differing parts with a little left context, e.g.
    ``cch=8c7f0 → 7ee55``; several regions are joined with ``; ``."""
    wa, wb = _WORD.findall(a), _WORD.findall(b)
    ops = [op for op in difflib.SequenceMatcher(None, wa, wb, autojunk=False).get_opcodes()]
    regions: list[list[int]] = []  # merged [i1, i2, j1, j2] over short equal gaps
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            continue
        if regions and i1 - regions[-1][1] <= 3:
            regions[-1][1], regions[-1][3] = i2, j2
        else:
            regions.append([i1, i2, j1, j2])
    parts = []
    for i1, i2, j1, j2 in regions[:limit]:
        left = "".join(wa[_context_start(wa, i1, context) : i1]).lstrip()
        old = _clip("".join(wa[i1:i2]))
        new = _clip("".join(wb[j1:j2]))
        parts.append(f"{left}{old or '∅'} → {new or '∅'}")
    if len(regions) > limit:
        parts.append(f"… {len(regions) - limit} more")
    return "; ".join(parts)


def _context_start(words: Sequence[str], i: int, most: int) -> int:
    """Where the left context of a change at ``words[i]`` starts: back to the start of
    its ``key=value`` run (the previous space, ``;`` or ``,``), at most ``most`` words."""
    start = i
    while (
        start > 0
        and i - start < most
        and not (words[start - 1].isspace() or words[start - 1] in ";,")
    ):
        start -= 1
    return start


def _clip(s: str, n: int = 60) -> str:
    s = s.replace("\n", "⏎")
    return s if len(s) <= n else s[: n - 1] + "…"


def _dates_differ(a: str, b: str) -> bool:
    return Counter(_DATE_TIME.findall(a)) != Counter(_DATE_TIME.findall(b))


# -- one pair ---------------------------------------------------------------------------


@dataclass
class PairBreak:
    out_index: int
    out_name: str
    out_kind: str
    offset: int  # estimated tokens before the segment, scaled to the recorded prompt
    in_name: str | None  # the segment of the request as received that changed
    in_prev: str | None  # its hashes before and after
    in_cur: str | None
    cause: str
    detail: str = ""
    diff: str | None = None  # what varies inside, when texts were captured


def _by_name(segs: Sequence[Segment]) -> dict[str, Segment]:
    return {s.name: s for s in segs}


def _scaled_offset(cur: Captured, raw: int) -> int:
    est = prefix_tokens(cur.seg_out)
    return round(raw * cur.prompt_tokens / est) if est else raw


def classify(
    prev: Captured, cur: Captured, texts: dict[str, str], *, same_session: bool
) -> PairBreak | None:
    """Where and why ``cur`` does not extend ``prev`` (None when it does). Across sessions,
    only a change before the first message counts (conversations differ by nature)."""
    fc = first_changed(prev.seg_out, cur.seg_out)
    if fc is None:
        return None
    seg = cur.seg_out[fc.index]
    if fc.index < len(prev.seg_out) and prev.seg_out[fc.index].kind in ("tools", "tool"):
        seg = prev.seg_out[fc.index]  # the tools left out: what follows did not change
    if not same_session and seg.kind == "message":
        return None
    brk = PairBreak(
        fc.index, seg.name, seg.kind, _scaled_offset(cur, fc.offset), None, None, None, UNKNOWN
    )
    prev_in, cur_in = _by_name(prev.seg_in), _by_name(cur.seg_in)
    if same_session and COMPACTED in (prev.change_class, cur.change_class):
        # the capture saw a compaction step on either side (a summary request the client
        # named, which the turn after does not extend, or the history rewritten against a
        # request this pair does not hold): a compaction boundary here too
        brk.cause = COMPACTION
        brk.detail = f"the record: a compaction (prompt {prev.prompt_tokens} → {cur.prompt_tokens})"
        return brk
    if seg.kind in ("tools", "tool"):
        a = [s.hash for s in prev.seg_out if s.kind == "tool"]
        b = [s.hash for s in cur.seg_out if s.kind == "tool"]
        brk.in_name = "tools"
        if sorted(a) == sorted(b) and a != b:
            brk.cause, brk.detail = REORDERED, f"same {len(a)} tools, different order"
        else:
            added, removed = len(set(b) - set(a)), len(set(a) - set(b))
            brk.cause, brk.detail = (
                TOOLS_CHANGED,
                f"{added} tool(s) added or changed, {removed} gone",
            )
        return brk
    if seg.kind == "message":
        msgs_prev = [s.hash for s in prev.seg_in if s.kind == "message"]
        msgs_cur = [s.hash for s in cur.seg_in if s.kind == "message"]
        restarted = msgs_prev and msgs_cur and msgs_prev[0] != msgs_cur[0]
        if restarted or len(msgs_cur) < len(msgs_prev) or compacted(prev.seg_in, cur.seg_in):
            brk.cause = COMPACTION
            brk.detail = (
                f"history restarted ({len(msgs_prev)} → {len(msgs_cur)} messages, "
                f"prompt {prev.prompt_tokens} → {cur.prompt_tokens})"
            )
        else:
            brk.detail = f"{seg.name} rewritten inside the history"
        brk.in_name = seg.name if seg.name in cur_in else None
        _attach_in(brk, prev_in, cur_in)
        return _with_diff(brk, prev, cur, texts)
    # a system segment
    in_system = [s for s in cur.seg_in if s.kind == "system"]
    changed = [s.name for s in in_system if s.name not in prev_in or prev_in[s.name].hash != s.hash]
    if changed:
        brk.in_name = changed[0]
        _attach_in(brk, prev_in, cur_in)
        first = in_system[0].name == changed[0]
        text = texts.get(brk.in_cur or "")
        if text is not None and plain_text(text).lstrip().startswith(BILLING_PREFIX):
            brk.cause, brk.detail = BILLING, f"{changed[0]} is Claude Code's billing header"
        elif text is None and first and cur.claude and in_system[0].tokens <= 200:
            brk.cause = BILLING
            brk.detail = (
                f"{changed[0]} of a Claude Code request ({in_system[0].tokens} tokens) changes; "
                "position and client say billing header (no text captured)"
            )
        return _with_diff(brk, prev, cur, texts)
    hoisted = [s.name for s in cur.seg_in if s.kind == "message" and s.name.endswith(":system")]
    if hoisted:
        grew = seg.tokens - (prev.seg_out[fc.index].tokens if fc.index < len(prev.seg_out) else 0)
        brk.cause = HOISTED
        brk.detail = (
            f"system blocks unchanged, but the upstream system prompt changed ({grew:+d} tokens) "
            f"while the request carries mid-conversation system message(s) {', '.join(hoisted[:3])}"
        )
    return _with_diff(brk, prev, cur, texts)


def _attach_in(brk: PairBreak, prev_in: dict[str, Segment], cur_in: dict[str, Segment]) -> None:
    if brk.in_name is None:
        return
    p, c = prev_in.get(brk.in_name), cur_in.get(brk.in_name)
    brk.in_prev = p.hash if p else None
    brk.in_cur = c.hash if c else None


def _with_diff(brk: PairBreak, prev: Captured, cur: Captured, texts: dict[str, str]) -> PairBreak:
    a = texts.get(brk.in_prev or "") if brk.in_prev else None
    b = texts.get(brk.in_cur or "") if brk.in_cur else None
    if a is None or b is None:
        a = (
            texts.get(prev.seg_out[brk.out_index].hash)
            if brk.out_index < len(prev.seg_out)
            else None
        )
        b = texts.get(cur.seg_out[brk.out_index].hash)
    if a is None or b is None:
        return brk
    ta, tb = plain_text(a), plain_text(b)
    if brk.cause == UNKNOWN and _dates_differ(ta, tb):
        brk.cause = TIMESTAMP
        brk.detail = f"a date/time inside {brk.in_name or brk.out_name} changes"
    brk.diff = diff_texts(ta, tb)
    return brk


# -- the slice --------------------------------------------------------------------------


@dataclass
class SegmentStability:
    segment: str
    side: str  # "in" (as received) or "out" (as sent upstream)
    tokens: int
    pairs: int
    changed_in_session: int
    sessions: int
    distinct_across_sessions: int

    @property
    def volatility(self) -> str:
        return volatility(
            self.changed_in_session, self.pairs, self.distinct_across_sessions, self.sessions
        )


def volatility(changed: int, pairs: int, distinct: int, sessions: int) -> str:
    if pairs and changed >= 0.5 * pairs:
        return PER_REQUEST
    if sessions >= 2 and distinct >= max(2, 0.5 * sessions) and changed <= 0.2 * max(pairs, 1):
        return PER_SESSION
    if changed or distinct > 1:
        return OCCASIONAL
    return "stable"


@dataclass
class SegmentReport:
    requests: int
    sessions: int
    pairs: int  # consecutive same-session pairs
    breaks: int  # pairs where the later one did not extend the earlier
    texts_captured: bool
    first_unstable: str | None = None  # out segment name (upstream order)
    first_unstable_kind: str | None = None
    in_segment: str | None = None
    offset_tokens: int | None = None  # median, scaled to recorded prompts
    cause: str | None = None
    cause_detail: str = ""
    volatility: str | None = None
    scope: str = "session"  # "session": breaks within sessions; "cross-session": only across
    diffs: list[str] = field(default_factory=list)
    causes: dict[str, int] = field(default_factory=dict)
    stability: list[SegmentStability] = field(default_factory=list)


def stability(reqs: Sequence[Captured], names: Sequence[tuple[str, str]]) -> list[SegmentStability]:
    """Within-session change counts and across-session distinct values of named segments."""
    by = sessions(reqs)
    out = []
    for side, name in names:
        pairs = changed = tokens = 0
        firsts: set[str] = set()
        n_sessions = 0
        for lst in by.values():
            segs = [_by_name(r.seg_in if side == "in" else r.seg_out).get(name) for r in lst]
            present = [s for s in segs if s is not None]
            if not present:
                continue
            n_sessions += 1
            firsts.add(present[0].hash)
            tokens = max(tokens, present[0].tokens)
            for a, b in zip(segs, segs[1:], strict=False):
                if a is not None and b is not None:
                    pairs += 1
                    changed += a.hash != b.hash
        out.append(SegmentStability(name, side, tokens, pairs, changed, n_sessions, len(firsts)))
    return out


def analyse(reqs: Sequence[Captured], texts_of: TextsOf) -> SegmentReport:
    """Analyse a slice's captured requests. ``texts_of(hashes) -> {hash: text}`` fetches
    stored texts (``Store.get_texts``)."""
    by = sessions(reqs)
    pairs = [(a, b) for lst in by.values() for a, b in zip(lst, lst[1:], strict=False)]
    captured = any(r.captured for r in reqs)
    report = SegmentReport(len(reqs), len(by), len(pairs), 0, captured)
    breaks = _breaks(pairs, texts_of, captured, same_session=True)
    report.breaks = len(breaks)
    scope = "session"
    # Sessions that extend themselves can still fail to share their common prefix.
    if len(breaks) < 0.2 * max(len(pairs), 1):
        firsts = sorted((lst[0] for lst in by.values()), key=lambda r: r.received_at)
        cross = _breaks(
            list(zip(firsts, firsts[1:], strict=False)), texts_of, captured, same_session=False
        )
        if len(cross) >= max(2, 0.5 * (len(firsts) - 1)):
            breaks, scope = cross, "cross-session"
    relevant = [b for b in breaks if b.cause != COMPACTION] or breaks
    report.causes = dict(Counter(b.cause for b in breaks).most_common())
    if not relevant:
        return report
    top_name, _ = Counter(b.out_name for b in relevant).most_common(1)[0]
    at = [b for b in relevant if b.out_name == top_name]
    cause, _ = Counter(b.cause for b in at).most_common(1)[0]
    chosen = [b for b in at if b.cause == cause]
    example = chosen[-1]
    report.scope = scope
    report.first_unstable = top_name
    report.first_unstable_kind = example.out_kind
    report.in_segment = example.in_name
    report.offset_tokens = round(statistics.median(b.offset for b in chosen))
    report.cause = cause
    report.cause_detail = example.detail
    report.diffs = list(dict.fromkeys(b.diff for b in reversed(chosen) if b.diff))[:3]
    names = [("out", top_name)]
    if example.in_name:
        names.insert(0, ("in", example.in_name))
        if example.in_name == top_name and all(r.seg_in == r.seg_out for r in reqs):
            names.pop()  # sent as received: one row says it
    for s in (s for s in (reqs[-1].seg_in if reqs else []) if s.kind == "system"):
        if ("in", s.name) not in names:
            names.append(("in", s.name))
    report.stability = stability(reqs, names)
    target = report.stability[0]
    report.volatility = target.volatility
    return report


def _breaks(
    pairs: Sequence[tuple[Captured, Captured]],
    texts_of: TextsOf,
    captured: bool,
    *,
    same_session: bool,
) -> list[PairBreak]:
    raw = []
    for prev, cur in pairs:
        b = classify(prev, cur, {}, same_session=same_session)
        if b is not None:
            raw.append((prev, cur, b))
    if not captured or not raw:
        return [b for _, _, b in raw]
    # Re-run the most recent breaks with their texts (diffs and text-based causes).
    recent = raw[-200:]
    hashes: set[str] = set()
    for prev, cur, b in recent:
        hashes.update(h for h in (b.in_prev, b.in_cur) if h)
        if b.out_index < len(prev.seg_out):
            hashes.add(prev.seg_out[b.out_index].hash)
        hashes.add(cur.seg_out[b.out_index].hash)
    texts = texts_of(hashes)
    redone = [classify(p, c, texts, same_session=same_session) for p, c, _ in recent]
    return [b for _, _, b in raw[: len(raw) - len(recent)]] + [b for b in redone if b is not None]


def matches_constant(offset: int | None, constant: int | None, block: int | None) -> bool:
    """Whether a segment's estimated token offset is the pinned cached constant (estimates
    are chars/4 of canonical JSON: approximate, within 15%, or equal once block-aligned)."""
    if offset is None or not constant:
        return False
    if block and offset // block * block == constant:
        return True
    return abs(offset - constant) <= MATCH_TOLERANCE * constant
