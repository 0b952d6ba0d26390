"""Slices: token-weighted hit rates split by every dimension, ranked by the tokens they lose.

One ``GROUP BY`` in the database over every dimension at once (plus the day) gives
"cells"; every slice (one dimension = one value) is a sum of cells, computed here. A
slice is compared with its peers — the other values of the same dimension on the same
upstream (channel and upstream model: the same prefix cache) — and what it loses is
``Σprompt × (best peer rate − its rate)``: the prefill a healthy client of that upstream
would not have paid. Channel and upstream model themselves are compared across the store.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from prefixgate.doctor import query
from prefixgate.doctor.findings import Rate
from prefixgate.store import Store

# Dimensions compared within one upstream, in the order a person names a slice by.
SCOPED = ("endpoint", "client", "session_kind", "requested_model", "key_name", "key_owner")
# Dimensions compared across the whole store.
GLOBAL = ("channel", "upstream_model")
DIMENSIONS = SCOPED + GLOBAL
# ``compared`` is no dimension of a slice: it splits the cells so that the breakers
# (doctor/breakers.py) count the requests the capture compared without a scan of their own.
_CELL_COLUMNS = ("channel", "upstream_model", *SCOPED, "compared")

MIN_REQUESTS = 10  # a slice (or a peer) smaller than this is not judged
MIN_GAP = 0.10  # weak: at least 10 points below its best peer ...
MIN_LOST_SHARE = 0.01  # ... and losing at least 1% of all prompt tokens
SAME_SET = 0.8  # two slices sharing this share of their tokens are one population


@dataclass(frozen=True)
class Cell:
    day: int
    channel: str | None
    upstream_model: str | None
    endpoint: str | None
    client: str | None
    session_kind: str | None
    requested_model: str | None
    key_name: str | None
    key_owner: str | None
    compared: str | None  # how the capture compared these requests (record.compared)
    requests: int
    prompt_tokens: int
    cached_tokens: int
    cached_null: int  # responses without a cached_tokens figure
    first: float = 0.0  # the first and last received_at
    last: float = 0.0
    max_prompt: int = 0  # the largest prompt served

    def get(self, column: str) -> str | None:
        return getattr(self, column)


def load_cells(store: Store, since: float | None, until: float | None) -> list[Cell]:
    """The one aggregation over the window, grouped by day and every dimension."""
    where, params = query.window(since, until)
    cols = ", ".join(_CELL_COLUMNS)
    sql = (
        f"SELECT {query.DAY}, {cols}, COUNT(*), SUM(prompt_tokens),"
        " SUM(COALESCE(cached_tokens, 0)),"
        " SUM(CASE WHEN cached_tokens IS NULL THEN 1 ELSE 0 END),"
        " MIN(received_at), MAX(received_at), MAX(prompt_tokens)"
        f" FROM requests WHERE {query.OK}{where}"
        f" GROUP BY {', '.join(str(i) for i in range(1, len(_CELL_COLUMNS) + 2))}"
    )
    out = []
    k = len(_CELL_COLUMNS) + 1
    for row in query.run(store, sql, params):
        day, *dims = row[:k]
        n, prompt, cached, null = (int(v or 0) for v in row[k : k + 4])
        first, last, biggest = float(row[k + 4]), float(row[k + 5]), int(row[k + 6] or 0)
        out.append(Cell(int(day), *dims, n, prompt, cached, null, first, last, biggest))
    return out


@dataclass
class Slice:
    dimension: str
    value: str | None
    channel: str | None = None  # the upstream it is judged on (None for global dimensions)
    upstream_model: str | None = None
    rate: Rate = field(default_factory=Rate)
    peer: str | None = None  # label of the best comparable slice
    peer_value: str | None = None
    peer_rate: Rate | None = None
    tokens_lost: int = 0
    aliases: list[str] = field(default_factory=list)  # the same population by other names

    @property
    def label(self) -> str:
        return f"{self.dimension}={self.value if self.value is not None else '(none)'}"

    @property
    def scope(self) -> str:
        if self.dimension in GLOBAL:
            return "all upstreams"
        return f"{self.channel} / {self.upstream_model}"

    @property
    def gap(self) -> float:
        return self.peer_rate.hit_rate - self.rate.hit_rate if self.peer_rate else 0.0

    def filters(self) -> list[tuple[str, str | None]]:
        """(column, value) pairs that select this slice's requests."""
        if self.dimension in GLOBAL:
            return [(self.dimension, self.value)]
        return [
            ("channel", self.channel),
            ("upstream_model", self.upstream_model),
            (self.dimension, self.value),
        ]

    def peer_filters(self) -> list[tuple[str, str | None]]:
        """(column, value) pairs that select the best peer's requests."""
        peer = Slice(self.dimension, self.peer_value, self.channel, self.upstream_model)
        return peer.filters()

    def same(self, other: Slice) -> bool:
        return (self.dimension, self.value, self.channel, self.upstream_model) == (
            other.dimension,
            other.value,
            other.channel,
            other.upstream_model,
        )

    def matches(self, cell: Cell) -> bool:
        return all(cell.get(col) == val for col, val in self.filters())

    def as_dict(self) -> dict:
        return {
            "slice": self.label,
            "scope": self.scope,
            "channel": self.channel,
            "upstream_model": self.upstream_model,
            **self.rate.as_dict(),
            "peer": self.peer,
            "peer_hit_rate": round(self.peer_rate.hit_rate, 6) if self.peer_rate else None,
            "tokens_lost": self.tokens_lost,
            "aliases": list(self.aliases),
        }


def total(cells: Iterable[Cell]) -> Rate:
    r = Rate()
    for c in cells:
        r.add(c.requests, c.prompt_tokens, c.cached_tokens)
    return r


def by_day(cells: Iterable[Cell]) -> dict[int, Rate]:
    days: dict[int, Rate] = defaultdict(Rate)
    for c in cells:
        days[c.day].add(c.requests, c.prompt_tokens, c.cached_tokens)
    return dict(sorted(days.items()))


def silent_channels(cells: Iterable[Cell], min_requests: int = 5) -> dict[str | None, int]:
    """Channels none of whose responses carried ``cached_tokens``: requests per channel."""
    seen: dict[str | None, list[int]] = defaultdict(lambda: [0, 0])
    for c in cells:
        seen[c.channel][0] += c.requests
        seen[c.channel][1] += c.cached_null
    return {ch: n for ch, (n, null) in seen.items() if n >= min_requests and null == n}


def group(cells: Iterable[Cell], dimensions: Iterable[str] = DIMENSIONS) -> list[Slice]:
    """Every slice of the given dimensions (scoped ones per upstream), without peers."""
    dims = tuple(dimensions)
    groups: dict[tuple, Slice] = {}
    for c in cells:
        for dim in dims:
            if dim in GLOBAL:
                key = (dim, None, None, c.get(dim))
                scope = (None, None)
            else:
                key = (dim, c.channel, c.upstream_model, c.get(dim))
                scope = (c.channel, c.upstream_model)
            s = groups.get(key)
            if s is None:
                s = groups[key] = Slice(dim, c.get(dim), *scope)
            s.rate.add(c.requests, c.prompt_tokens, c.cached_tokens)
    return list(groups.values())


def rank(cells: list[Cell], *, exclude_channels: Iterable[str | None] = ()) -> list[Slice]:
    """Every slice with a peer to compare with, most tokens lost first."""
    excluded = set(exclude_channels)
    peers: dict[tuple, list[Slice]] = defaultdict(list)
    for s in group(c for c in cells if c.channel not in excluded):
        peers[(s.dimension, s.channel, s.upstream_model)].append(s)
    ranked = []
    for members in peers.values():
        judged = [s for s in members if s.rate.requests >= MIN_REQUESTS]
        if len(judged) < 2:
            continue
        best = max(judged, key=lambda s: (s.rate.hit_rate, s.rate.prompt_tokens))
        for s in judged:
            if s is best:
                continue
            s.peer, s.peer_value, s.peer_rate = best.label, best.value, best.rate
            s.tokens_lost = round(s.rate.prompt_tokens * (best.rate.hit_rate - s.rate.hit_rate))
            ranked.append(s)
    ranked.sort(key=lambda s: (-s.tokens_lost, s.label))
    return ranked


def _overlap(a: Slice, b: Slice, cells: list[Cell]) -> int:
    return sum(c.prompt_tokens for c in cells if a.matches(c) and b.matches(c))


def _priority(s: Slice) -> int:
    return DIMENSIONS.index(s.dimension)


def weak(ranked: list[Slice], cells: list[Cell]) -> list[Slice]:
    """The slices that pull the total down, one per population: slices that are (nearly)
    the same requests (``endpoint=messages``, ``client=claude-cli``) are merged, named by
    the most natural dimension, the others kept as aliases. A channel or upstream model
    that is weak because of a weak slice inside it is not listed again."""
    everything = sum(c.prompt_tokens for c in cells) or 1
    candidates = [
        s
        for s in ranked
        if s.gap >= MIN_GAP and s.tokens_lost >= MIN_LOST_SHARE * everything and s.rate.requests
    ]
    # scoped slices first: they name a population; global ones only what is left
    candidates.sort(key=lambda s: (s.dimension in GLOBAL, -s.tokens_lost, s.label))
    clusters: list[list[Slice]] = []
    for s in candidates:
        for cluster in clusters:
            head = cluster[0]
            shared = _overlap(head, s, cells)
            if shared >= SAME_SET * max(head.rate.prompt_tokens, s.rate.prompt_tokens):
                cluster.append(s)
                break
            inside = s.dimension in GLOBAL and shared >= SAME_SET * head.rate.prompt_tokens
            if inside and head.tokens_lost >= 0.5 * s.tokens_lost:
                head.aliases.append(f"within {s.label}")
                break
        else:
            clusters.append([s])
    out = []
    for cluster in clusters:
        primary = min(cluster, key=_priority)
        primary.aliases = [x for x in cluster[0].aliases if x.startswith("within ")] + [
            s.label for s in cluster if s is not primary
        ]
        out.append(primary)
    out.sort(key=lambda s: -s.tokens_lost)
    return out
