"""The replay: requests through a :class:`~prefixgate.cache.tiers.TieredCache`.

Untimed (default): requests run one after another; each frees its blocks before the next
starts. Timed: a request starts at its arrival time and holds its GPU blocks until it
finishes, ``computed / prefill_rate + output_tokens / decode_rate`` seconds later (no
queueing, no preemption; a request that does not fit gets the leading blocks that do).

Besides vLLM's rules (token hits, last-token rule, partial block never a hit), a trace with
its own block ids (Mooncake) is also scored by the convention other trace simulators
publish: each id one block, a request's hit is the longest prefix of its ids already seen,
ratio = Σ hit ids / Σ ids. That convention runs its own id-level LRU of the GPU capacity
(unlimited when the GPU is), with no host tier and no last-token rule.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prefixgate.cache.groups import DEFAULT_GROUPS, KVGroup, Policy, format_groups
from prefixgate.cache.tiers import Offload, TieredCache, TierLease

from .traces import TraceRequest

__all__ = ["IdCache", "RequestRow", "Run", "RunConfig", "Stats", "replay"]

Progress = Callable[[int, int | None], None]


@dataclass(frozen=True, slots=True)
class RunConfig:
    block_size: int
    gpu_capacity_tokens: int | None = None  # None: unlimited
    host_capacity_tokens: int | None = None  # with host=True; None: unlimited
    host: bool = False
    groups: tuple[KVGroup, ...] = DEFAULT_GROUPS
    policy: Policy = "veto"
    offload: Offload = "through"
    timed: bool = False
    prefill_rate: float | None = None  # tokens/s
    decode_rate: float = 50.0  # tokens/s per request (timed mode)
    bytes_per_block: int | None = None
    id_block_size: int | None = None  # block size of the trace's own ids (Mooncake: 512)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["groups"] = format_groups(self.groups)
        if not self.host:
            d["host_capacity_tokens"] = None
        return d


@dataclass(slots=True)
class Stats:
    """Sums over a run. Token rates divide by ``prompt_tokens``, block rates by
    ``query_blocks`` (every block of every prompt, the partial last one included)."""

    requests: int = 0
    prompt_tokens: int = 0
    query_blocks: int = 0
    gpu_hit_tokens: int = 0
    host_hit_tokens: int = 0
    recompute_tokens: int = 0
    host_queried_tokens: int = 0  # prompt tokens after the GPU hit (asked of the host)
    host_stores: int = 0
    host_loads: int = 0
    host_store_bytes: int | None = None
    host_load_bytes: int | None = None
    host_blocks: int = 0  # blocks in host memory at the end
    gpu_evicted_blocks: int = 0
    host_evicted_blocks: int = 0
    incomplete_requests: int = 0  # did not fit in the GPU
    ids_total: int = 0
    ids_hit: int = 0
    sum_request_id_ratio: float = 0.0
    sum_request_token_ratio: float = 0.0
    prefill_rate: float | None = None

    @property
    def cached_tokens(self) -> int:
        return self.gpu_hit_tokens + self.host_hit_tokens

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens + self.recompute_tokens

    def _rate(self, num: float, den: float) -> float:
        return num / den if den else 0.0

    @property
    def gpu_token_hit_rate(self) -> float:
        return self._rate(self.gpu_hit_tokens, self.prompt_tokens)

    @property
    def host_token_hit_rate(self) -> float:
        return self._rate(self.host_hit_tokens, self.prompt_tokens)

    @property
    def token_hit_rate(self) -> float:
        return self._rate(self.cached_tokens, self.prompt_tokens)

    @property
    def external_hit_rate(self) -> float:
        """vLLM's "External prefix cache hit rate": host hits / tokens asked of the host."""
        return self._rate(self.host_hit_tokens, self.host_queried_tokens)

    def block_hit_rates(self, block_size: int) -> tuple[float, float, float]:
        g = self.gpu_hit_tokens // block_size
        h = self.host_hit_tokens // block_size
        q = self.query_blocks
        return self._rate(g, q), self._rate(h, q), self._rate(g + h, q)

    @property
    def id_hit_ratio(self) -> float | None:
        return self._rate(self.ids_hit, self.ids_total) if self.ids_total else None

    @property
    def mean_request_id_ratio(self) -> float | None:
        return self._rate(self.sum_request_id_ratio, self.requests) if self.ids_total else None

    @property
    def mean_request_token_hit_rate(self) -> float:
        return self._rate(self.sum_request_token_ratio, self.requests)

    @property
    def prefill_seconds(self) -> float | None:
        r = self.prefill_rate
        return None if not r else self.computed_tokens / r

    @property
    def prefill_seconds_saved(self) -> float | None:
        r = self.prefill_rate
        return None if not r else (self.prompt_tokens - self.computed_tokens) / r

    def as_dict(self, block_size: int) -> dict[str, Any]:
        gb, hb, tb = self.block_hit_rates(block_size)
        d: dict[str, Any] = {
            f.name: getattr(self, f.name)
            for f in self.__dataclass_fields__.values()
            if not f.name.startswith("sum_")
        }
        d.update(
            cached_tokens=self.cached_tokens,
            computed_tokens=self.computed_tokens,
            gpu_token_hit_rate=self.gpu_token_hit_rate,
            host_token_hit_rate=self.host_token_hit_rate,
            token_hit_rate=self.token_hit_rate,
            gpu_block_hit_rate=gb,
            host_block_hit_rate=hb,
            block_hit_rate=tb,
            external_hit_rate=self.external_hit_rate,
            mean_request_token_hit_rate=self.mean_request_token_hit_rate,
            id_hit_ratio=self.id_hit_ratio,
            mean_request_id_ratio=self.mean_request_id_ratio,
            prefill_seconds=self.prefill_seconds,
            prefill_seconds_saved=self.prefill_seconds_saved,
        )
        return d


@dataclass(frozen=True, slots=True)
class RequestRow:
    index: int
    arrival: float | None
    prompt_tokens: int
    gpu_hit_tokens: int
    host_hit_tokens: int
    recompute_tokens: int
    ids: int = 0
    ids_hit: int = 0

    @property
    def computed_tokens(self) -> int:
        return (
            self.prompt_tokens - self.gpu_hit_tokens - self.host_hit_tokens + self.recompute_tokens
        )


@dataclass(slots=True)
class Run:
    label: str
    config: RunConfig
    stats: Stats
    rows: list[RequestRow] = field(default_factory=list)


class IdCache:
    """The id-level convention: longest prefix of ids already seen, then all ids become
    most recent. ``capacity`` in ids (``None``: unlimited, a plain set)."""

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self._set: set[Hashable] = set()
        self._lru: OrderedDict[Hashable, None] = OrderedDict()

    def process(self, ids: Sequence[Hashable]) -> int:
        if self.capacity is None:
            seen = self._set
            n = 0
            for h in ids:
                if h not in seen:
                    break
                n += 1
            seen.update(ids)
            return n
        lru = self._lru
        n = 0
        for h in ids:
            if h not in lru:
                break
            n += 1
        if self.capacity <= 0:
            return 0
        for h in ids:
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > self.capacity:
            lru.popitem(last=False)
        return n


def replay(
    requests: Sequence[TraceRequest],
    config: RunConfig,
    *,
    label: str = "run",
    keep_rows: bool = True,
    progress: Progress | None = None,
) -> Run:
    """Replay ``requests`` (in arrival order) under ``config``."""
    bs = config.block_size
    cache = TieredCache(
        bs,
        config.gpu_capacity_tokens,
        config.host_capacity_tokens,
        host=config.host,
        groups=config.groups,
        policy=config.policy,
        offload=config.offload,
        bytes_per_block=config.bytes_per_block,
    )
    ids_cache: IdCache | None = None
    if config.id_block_size:
        cap = config.gpu_capacity_tokens
        ids_cache = IdCache(None if cap is None else cap // config.id_block_size)
    st = Stats(prefill_rate=config.prefill_rate)
    rows: list[RequestRow] = []
    running: list[tuple[float, int, TierLease]] = []  # (finish time, seq, lease)
    timed = config.timed
    prefill_rate = config.prefill_rate
    decode_rate = config.decode_rate
    total = len(requests)
    begin, end = cache.begin, cache.end
    for i, req in enumerate(requests):
        n = req.num_tokens
        if timed:
            now = req.arrival or 0.0
            while running and running[0][0] <= now:
                end(heapq.heappop(running)[2])
        lease = begin(req.keys, n)
        res = lease.result
        if not lease.handle.complete:
            st.incomplete_requests += 1
        if timed:
            hold = res.computed_tokens / prefill_rate if prefill_rate else 0.0
            hold += req.output_tokens / decode_rate if decode_rate else 0.0
            heapq.heappush(running, ((req.arrival or 0.0) + hold, i, lease))
        else:
            end(lease)
        st.requests += 1
        st.prompt_tokens += n
        st.query_blocks += -(-n // bs)
        st.gpu_hit_tokens += res.gpu_hit_tokens
        st.host_hit_tokens += res.host_hit_tokens
        st.recompute_tokens += res.recompute_tokens
        if cache.host is not None:
            st.host_queried_tokens += n - res.gpu_hit_tokens
        if n:
            st.sum_request_token_ratio += res.cached_tokens / n
        ids_hit = n_ids = 0
        if ids_cache is not None and req.ids is not None:
            n_ids = len(req.ids)
            ids_hit = ids_cache.process(req.ids)
            st.ids_total += n_ids
            st.ids_hit += ids_hit
            if n_ids:
                st.sum_request_id_ratio += ids_hit / n_ids
        if keep_rows:
            rows.append(
                RequestRow(
                    i,
                    req.arrival,
                    n,
                    res.gpu_hit_tokens,
                    res.host_hit_tokens,
                    res.recompute_tokens,
                    n_ids,
                    ids_hit,
                )
            )
        if progress is not None and (i + 1) % 1000 == 0:
            progress(i + 1, total)
    while running:
        end(heapq.heappop(running)[2])
    st.gpu_evicted_blocks = cache.gpu.evicted_blocks
    host = cache.host
    if host is not None:
        st.host_stores = host.stores
        st.host_loads = host.loads
        st.host_store_bytes = host.store_bytes
        st.host_load_bytes = host.load_bytes
        st.host_blocks = len(host)
        st.host_evicted_blocks = host.evicted
    if progress is not None:
        progress(total, total)
    return Run(label, config, st, rows)
