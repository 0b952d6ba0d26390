"""Distributions: what a slice's cached-token figures look like, not just their mean.

A healthy slice's ``cached_tokens`` follow its prompts (each turn hits what the previous
one left). A slice whose cache breaks at a fixed point shows a *pinned constant*: one exact
non-zero value held by a large share of the requests while their prompts vary widely —
the billing-header incident's 17920 = 280 × 64, the tool definitions rendered before a volatile header.
Probabilistic causes (eviction, contention) never produce an exact constant.

The aggregation (one row per distinct cached value) runs in the database.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prefixgate.doctor import query
from prefixgate.store import Store

PINNED_SHARE = 0.25  # a value held by at least a quarter of the slice's requests ...
PINNED_MIN_REQUESTS = 3
PINNED_SPREAD = 0.10  # ... whose prompts vary (coefficient of variation) at least this much
EXPLAINS = 0.8  # the constant explains the rate when it makes up 80% of the cached tokens
# Upper bounds of the cached-token buckets (the last is open).
BUCKETS = (1024, 16384, 65536, 131072)


@dataclass(frozen=True)
class ValueGroup:
    """The requests of a slice that reported one exact ``cached`` value."""

    cached: int
    requests: int
    prompt_sum: int
    prompt_min: int
    prompt_max: int
    prompt_sumsq: float

    @property
    def prompt_mean(self) -> float:
        return self.prompt_sum / self.requests if self.requests else 0.0

    @property
    def prompt_cv(self) -> float:
        if self.requests < 2 or not self.prompt_sum:
            return 0.0
        mean = self.prompt_mean
        var = max(self.prompt_sumsq / self.requests - mean * mean, 0.0)
        return math.sqrt(var) / mean


def _filters(filters: Sequence[tuple[str, str | None]]) -> tuple[str, list[str | None]]:
    sql, params = "", []
    for column, value in filters:
        s, p = query.equals(column, value)
        sql += s
        params += p
    return sql, params


def load(
    store: Store,
    filters: Sequence[tuple[str, str | None]],
    since: float | None = None,
    until: float | None = None,
) -> list[ValueGroup]:
    """One row per exact cached value among the slice's successful requests."""
    where, params = query.window(since, until)
    fsql, fparams = _filters(filters)
    sql = (
        "SELECT COALESCE(cached_tokens, 0), COUNT(*), SUM(prompt_tokens), MIN(prompt_tokens),"
        " MAX(prompt_tokens), SUM(prompt_tokens * 1.0 * prompt_tokens)"
        f" FROM requests WHERE {query.OK}{where}{fsql} GROUP BY 1"
    )
    rows = query.run(store, sql, params + fparams)
    return sorted(
        (
            ValueGroup(int(c), int(n), int(s), int(lo), int(hi), float(sq))
            for c, n, s, lo, hi, sq in rows
        ),
        key=lambda g: g.cached,
    )


def cached_values(
    store: Store,
    filters: Sequence[tuple[str, str | None]],
    since: float | None = None,
    until: float | None = None,
) -> list[int]:
    """The distinct non-zero cached values on an upstream (for the block size)."""
    where, params = query.window(since, until)
    fsql, fparams = _filters(filters)
    sql = (
        "SELECT DISTINCT cached_tokens FROM requests"
        f" WHERE {query.OK} AND cached_tokens > 0{where}{fsql}"
    )
    return sorted(int(r[0]) for r in query.run(store, sql, params + fparams))


@dataclass
class BlockSize:
    block: int
    gcd: int
    distinct_values: int
    confident: bool  # enough distinct values that the gcd is the block, not a multiple
    source: str = "cached values"


def infer_block(values: Sequence[int]) -> BlockSize | None:
    """The cache's block size from hit lengths: every hit is a whole number of blocks, so
    the gcd is a multiple of it. A gcd that is a multiple of 16 is snapped to its largest
    power-of-two divisor (vLLM block sizes are powers of two); otherwise (SGLang's
    token-granular radix cache) the gcd itself."""
    nonzero = sorted({int(v) for v in values if v > 0})
    if not nonzero:
        return None
    g = 0
    for v in nonzero:
        g = math.gcd(g, v)
    block = g & -g if g % 16 == 0 else g
    return BlockSize(block, g, len(nonzero), confident=len(nonzero) >= 4)


@dataclass
class Bucket:
    label: str
    requests: int
    prompt_mean: float
    cached_mean: float


@dataclass
class Pinned:
    value: int
    block: int
    k: int  # value = k × block
    requests: int
    share: float  # of the slice's requests
    prompt_min: int
    prompt_max: int
    prompt_mean: float
    prompt_cv: float
    slice_prompt_mean: float
    naive_ratio: float  # value / the slice's mean prompt
    explained_rate: float  # value × requests / Σprompt of the slice
    measured_rate: float
    explains: bool

    @property
    def expression(self) -> str:
        return f"{self.value} = {self.k} × {self.block}" if self.block > 1 else str(self.value)


@dataclass
class Distribution:
    requests: int
    prompt_tokens: int
    cached_tokens: int
    buckets: list[Bucket] = field(default_factory=list)
    modes: list[dict[str, Any]] = field(default_factory=list)  # top exact non-zero values
    pinned: Pinned | None = None

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _bucket_label(lo: int, hi: int | None) -> str:
    def k(n: int) -> str:
        return f"{n // 1024}k" if n >= 1024 else str(n)

    return f"≥ {k(lo)}" if hi is None else f"{k(lo)}–{k(hi)}"


def analyse(groups: Sequence[ValueGroup], block: int | None) -> Distribution:
    n = sum(g.requests for g in groups)
    prompt = sum(g.prompt_sum for g in groups)
    cached = sum(g.cached * g.requests for g in groups)
    dist = Distribution(n, prompt, cached)
    if not n:
        return dist
    # buckets: exactly 0, then ranges [lo, hi)
    rows: list[tuple[str, list[ValueGroup]]] = [("0", [g for g in groups if g.cached == 0])]
    edges = [1, *BUCKETS, None]
    for lo, hi in zip(edges, edges[1:], strict=False):
        members = [g for g in groups if g.cached >= lo and (hi is None or g.cached < hi)]
        rows.append((_bucket_label(lo, hi), members))
    for label, members in rows:
        r = sum(g.requests for g in members)
        if not r:
            continue
        dist.buckets.append(
            Bucket(
                label,
                r,
                sum(g.prompt_sum for g in members) / r,
                sum(g.cached * g.requests for g in members) / r,
            )
        )
    nonzero = sorted((g for g in groups if g.cached > 0), key=lambda g: (-g.requests, g.cached))
    for g in nonzero[:5]:
        dist.modes.append(
            {
                "cached": g.cached,
                "requests": g.requests,
                "share": round(g.requests / n, 6),
                "prompt_min": g.prompt_min,
                "prompt_max": g.prompt_max,
                "prompt_mean": round(g.prompt_mean, 1),
            }
        )
    if nonzero:
        top = nonzero[0]
        spread = max(top.prompt_cv, (top.prompt_max - top.prompt_min) / (2 * top.prompt_mean))
        if top.requests >= max(PINNED_MIN_REQUESTS, PINNED_SHARE * n) and spread >= PINNED_SPREAD:
            b = block if block and top.cached % block == 0 else 1
            explained = top.cached * top.requests / prompt
            dist.pinned = Pinned(
                value=top.cached,
                block=b,
                k=top.cached // b,
                requests=top.requests,
                share=top.requests / n,
                prompt_min=top.prompt_min,
                prompt_max=top.prompt_max,
                prompt_mean=top.prompt_mean,
                prompt_cv=top.prompt_cv,
                slice_prompt_mean=prompt / n,
                naive_ratio=top.cached / (prompt / n),
                explained_rate=explained,
                measured_rate=dist.hit_rate,
                explains=cached > 0 and explained >= EXPLAINS * dist.hit_rate,
            )
    return dist
