"""Breakers: what changes between consecutive requests of a session while later content
is re-sent — found per session, with no healthy peer to compare with.

The capture step compared every request with its session's previous one and recorded
where the upstream prompt stopped extending it, which received segment changed, the shape
of the change and how much of the earlier prompt came again after the break (see
:mod:`prefixgate.record.changes`). Everything after the break was computed again: those
re-sent tokens are what the breaker costs. Here they are summed inside the database, per
upstream (channel and model), client, segment and class of change, and a breaker is
reported when it costs a material share of the prompt tokens (or tokens per day),
whether or not any other slice of the traffic is better: when every session has the same
breaker, there is no peer to compare with, and the loss is still there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prefixgate.doctor import query
from prefixgate.doctor.slices import Cell, load_cells
from prefixgate.record.compacted import COMPACTED
from prefixgate.record.record import Change
from prefixgate.record.shape import CLASSES
from prefixgate.store import Store
from prefixgate.store.schema import decode_change

MIN_LOSS_SHARE = 0.02  # a breaker costing 2% of an upstream's prompt tokens is reported ...
MIN_LOSS_PER_DAY = 5_000_000  # ... or 5M tokens a day
MIN_BREAKS = 2  # one break is an accident


@dataclass
class Breaker:
    """One segment that breaks the prefix, on one upstream, for one client."""

    channel: str | None
    upstream_model: str | None
    client: str | None
    scope: str  # "session" (changes within sessions) | "sessions" (differs across them)
    segment: str  # the received segment that changes
    cls: str  # the dominant class of change
    classes: dict[str, int]  # every class seen there, with its count
    breaks: int  # requests whose prefix broke there
    sessions: int
    compared: int  # requests of the upstream compared the same way (the denominator)
    lost_tokens: int  # prompt tokens re-sent after the break, recomputed
    at_tokens: int  # mean prompt tokens before the break
    # the prompt tokens it is a share of: all of the client's on the upstream for a
    # change within sessions; those of the session openings compared, for one across them
    prompt_tokens: int
    days: float  # the client's traffic on the upstream spans this many days
    example: Change | None = None
    corroboration: list[str] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.lost_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def per_day(self) -> float | None:
        """Tokens lost a day, over a window of a day or more (None below: a burst of a
        few minutes says nothing about a day)."""
        return self.lost_tokens / self.days if self.days >= 1.0 else None

    @property
    def rate(self) -> float:
        """How often it breaks: breaks per compared request."""
        return self.breaks / self.compared if self.compared else 0.0

    def filters(self) -> list[tuple[str, str | None]]:
        return [("channel", self.channel), ("upstream_model", self.upstream_model)]

    def as_dict(self) -> dict:
        from msgspec import to_builtins

        return {
            "channel": self.channel,
            "upstream_model": self.upstream_model,
            "client": self.client,
            "scope": self.scope,
            "segment": self.segment,
            "class": self.cls,
            "class_name": CLASSES.get(self.cls, self.cls),
            "classes": dict(self.classes),
            "breaks": self.breaks,
            "sessions": self.sessions,
            "compared": self.compared,
            "rate": round(self.rate, 4),
            "lost_tokens": self.lost_tokens,
            "lost_share": round(self.share, 6),
            "lost_per_day": None if self.per_day is None else round(self.per_day),
            "at_tokens": self.at_tokens,
            "prompt_tokens": self.prompt_tokens,
            "upstream_segment": self.example.upstream if self.example else None,
            "kind": self.example.kind if self.example else None,
            "known": self.example.known if self.example else None,
            "shape": to_builtins(self.example.shape)
            if self.example and self.example.shape
            else None,
        }


@dataclass
class Upstream:
    requests: int = 0
    prompt_tokens: int = 0
    compared: dict[str, int] = field(default_factory=dict)
    compared_prompt: dict[str, int] = field(default_factory=dict)
    first: float = 0.0
    last: float = 0.0


def _upstreams(cells: Iterable[Cell]) -> dict[tuple, Upstream]:
    """Requests and prompt tokens per upstream and client, split by how the capture
    compared them: summed from the slices' cells (no scan of its own)."""
    out: dict[tuple, Upstream] = {}
    for c in cells:
        key = (c.channel, c.upstream_model, c.client)
        u = out.setdefault(key, Upstream(first=c.first, last=c.last))
        u.requests += c.requests
        u.prompt_tokens += c.prompt_tokens
        u.first, u.last = min(u.first, c.first), max(u.last, c.last)
        if c.compared is not None:
            u.compared[c.compared] = u.compared.get(c.compared, 0) + c.requests
            u.compared_prompt[c.compared] = u.compared_prompt.get(c.compared, 0) + c.prompt_tokens
    return out


def load(
    store: Store,
    since: float | None = None,
    until: float | None = None,
    cells: Iterable[Cell] | None = None,
) -> list[Breaker]:
    """Every breaker in the window, most tokens lost first (material or not); ``cells``
    are the window's slice cells when the caller has them."""
    if cells is None:
        cells = load_cells(store, since, until)
    upstreams = _upstreams(cells)
    where, params = query.window(since, until)
    # What the break cost: the tokens re-sent after it, but no more than the upstream
    # reports uncached (another session may have put the same bytes in the cache: two
    # clocks read in the same second).
    lost = (
        "CASE WHEN cached_tokens IS NOT NULL"
        " AND prompt_tokens - cached_tokens < prompt_tokens * change_lost"
        " THEN prompt_tokens - cached_tokens ELSE prompt_tokens * change_lost END"
    )
    sql = (
        "SELECT channel, upstream_model, client, compared, change_segment, change_class,"
        f" COUNT(*), COUNT(DISTINCT session_id), SUM({lost}),"
        " SUM(prompt_tokens * change_at), MAX(CAST(change AS TEXT))"
        f" FROM requests WHERE {query.OK} AND change_class IS NOT NULL"
        # a compacted context is a new history by design, not a breaker
        f" AND change_class <> '{COMPACTED}'{where}"
        " GROUP BY channel, upstream_model, client, compared, change_segment, change_class"
    )
    merged: dict[tuple, Breaker] = {}
    examples: dict[tuple, dict[str, str]] = {}
    for row in query.run(store, sql, params):
        ch, model, client, scope, segment, cls, n, sessions, lost, at, example = row
        scope = scope or "session"
        u = upstreams.get((ch, model, client), Upstream())
        key = (ch, model, client, scope, segment)
        b = merged.get(key)
        if b is None:
            b = merged[key] = Breaker(
                channel=ch,
                upstream_model=model,
                client=client,
                scope=scope,
                segment=segment or "?",
                cls=cls,
                classes={},
                breaks=0,
                sessions=0,
                compared=u.compared.get(scope, 0),
                lost_tokens=0,
                at_tokens=0,
                prompt_tokens=(
                    u.compared_prompt.get(scope, 0) if scope == "sessions" else u.prompt_tokens
                ),
                days=(u.last - u.first) / 86400.0,
            )
        n = int(n)
        b.classes[cls] = b.classes.get(cls, 0) + n
        b.at_tokens = round((b.at_tokens * b.breaks + float(at or 0)) / (b.breaks + n))
        b.breaks += n
        b.sessions = max(b.sessions, int(sessions))  # a lower bound across classes
        b.lost_tokens += round(float(lost or 0))
        if example is not None:
            examples.setdefault(key, {})[cls] = example
    out = list(merged.values())
    for key, b in merged.items():
        b.cls = Counter(b.classes).most_common(1)[0][0]
        b.example = decode_change(examples.get(key, {}).get(b.cls))
    out.sort(key=lambda b: -b.lost_tokens)
    return out


def material(
    breakers: Sequence[Breaker],
    *,
    min_share: float = MIN_LOSS_SHARE,
    min_per_day: float = MIN_LOSS_PER_DAY,
) -> list[Breaker]:
    """The breakers worth a finding: a share of their client's prompt tokens on the
    upstream, or tokens a day, at least the thresholds. A segment that changes within
    sessions differs across them too: that is said on it, not as a second breaker."""
    worth = [
        b
        for b in breakers
        if b.breaks >= MIN_BREAKS and (b.share >= min_share or (b.per_day or 0.0) >= min_per_day)
    ]
    within = {
        (b.channel, b.upstream_model, b.client, b.segment): b for b in worth if b.scope == "session"
    }
    out = []
    for b in worth:
        host = within.get((b.channel, b.upstream_model, b.client, b.segment))
        if b.scope == "sessions" and host is not None:
            host.corroboration.append(
                f"it differs across sessions too ({b.breaks} of {b.compared} session openings)"
            )
            continue
        out.append(b)
    return out


# -- words ------------------------------------------------------------------------------


def segment_name(name: str) -> str:
    """``system[1]`` → "system block 1", ``messages[1]:system`` → "the mid-conversation
    system message (messages[1])", a tool's name → "tool Edit's definition"."""
    if name == "system":
        return "the system prompt"
    if name.startswith("system["):
        return f"system block {name[7:-1]}"
    if name == "tools":
        return "the tool list"
    if name.startswith("messages["):
        index, _, role = name[9:].partition("]:")
        if role == "system":
            return f"the mid-conversation system message (messages[{index}])"
        return f"message {index} ({role})"
    return f"tool {name}'s definition"


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")


def where(b: Breaker) -> str:
    """Where the change starts, in words: "after the first paragraph of system block 1
    (line 3, char 202, ≈ token 50)"."""
    shape = b.example.shape if b.example else None
    name, pre = segment_name(b.segment), ""
    if b.example is not None and b.example.known == "billing_header":
        name, pre = "Claude Code's billing header", f"{segment_name(b.segment)}, "
    elif b.example is not None and b.example.known == "total_tokens_reminder":
        name, pre = "Claude Code's <total_tokens> reminder", f"{segment_name(b.segment)}, "
    if shape is None or not shape.text_chars or shape.char_offset == 0:
        start = "at the start of" if shape is not None and shape.text_chars else "in"
        return f"{start} {name}" + (f" ({pre.rstrip(', ')})" if pre else "")
    at = f"char {shape.char_offset:,}, ≈ token {shape.token_offset:,}"
    if shape.paragraph > 1:
        return (
            f"after the {_ordinal(shape.paragraph - 1)} paragraph of {name} "
            f"({pre}line {shape.line}, {at})"
        )
    line = f"line {shape.line}, " if shape.line > 1 else ""
    return f"in {name} ({pre}{line}{at})"


def what(b: Breaker) -> str:
    """The changing value, in words: "a time of day (99:99:99)"."""
    shape = b.example.shape if b.example else None
    text = CLASSES.get(b.cls, b.cls)
    if shape is not None:
        if shape.new_skeleton and b.cls not in ("content_edit", "serialization"):
            text += f" ({shape.new_skeleton})"
        if shape.detail:
            text += f" ({shape.detail})"
    return text


def how_often(b: Breaker) -> str:
    if b.scope == "sessions":
        every = "in every new session" if b.rate >= 0.95 else "across sessions"
        return f"{every} ({b.breaks} of {b.compared} session openings compared)"
    if b.rate >= 0.95:
        often = "on every request"
    elif b.rate >= 0.5:
        often = "on most requests"
    else:
        often = "now and then"
    return f"{often} ({b.breaks} of {b.compared} consecutive requests, {b.sessions} sessions)"


def advice(b: Breaker) -> list[str]:
    """The fix, on the side that can make it."""
    name = segment_name(b.segment)
    known = b.example.known if b.example else None
    ch = b.channel or "(its channel)"
    if known == "billing_header":
        return [
            f"enable `strip_anthropic_billing_header: true` on channel {ch} (drops the "
            "`x-anthropic-billing-header:` system block on Messages → OpenAI conversion; "
            "never for the vendor's own API, which reads it)",
            "or on every Claude Code client: `CLAUDE_CODE_ATTRIBUTION_HEADER=0`",
        ]
    if known == "total_tokens_reminder":
        return [
            f"in {name}: Claude Code's `<total_tokens>` reminder counts down in the system "
            "prompt; on every Claude Code client: `CLAUDE_CODE_TOTAL_TOKENS_REMINDER=off` (or "
            "the setting `totalTokensReminder: off`), or a version that keeps it constant "
            "there (2.1.332 sends the window) and puts the count in later system messages, "
            "which the gateway delivers in place (docs/rendering.md)",
        ]
    cls = b.cls
    if cls in ("time_of_day", "date", "date_time", "epoch"):
        rounding = "to the day" if cls == "date" else "to the day, or drop the time"
        return [
            f"take the {CLASSES[cls].removeprefix('a ').removeprefix('an ')} out of {name}: "
            "put it in the latest user message (after the history), or round it "
            f"{rounding}, in the client or agent framework that templates it",
        ]
    if cls in ("uuid", "nonce", "counter"):
        per = "per session" if b.scope == "sessions" else "per request"
        return [
            f"a value that is new {per} sits in {name}: drop it, or move it after the "
            "history (into the latest user message), in the client that writes it",
        ]
    if cls == "reordered_list":
        return [
            "send the list in a stable order (e.g. tools sorted by name) from the client or "
            "the MCP aggregator that builds it",
        ]
    if cls == "serialization":
        return [
            f"serialize {name} the same way every time (a fixed key order, e.g. sorted "
            "keys) in the client or MCP server that builds it: the upstream's template "
            "renders the JSON as it comes, so another key order is another prompt",
        ]
    if cls == "whitespace":
        return [f"normalize the whitespace of {name} in the client that builds it"]
    return [
        f"{name} is edited between requests: keep it stable, or put what changes after "
        "the history; capture texts (`capture_text: true`) to see the edit",
    ]


__all__ = [
    "MIN_LOSS_PER_DAY",
    "MIN_LOSS_SHARE",
    "Breaker",
    "advice",
    "how_often",
    "load",
    "material",
    "segment_name",
    "what",
    "where",
]
