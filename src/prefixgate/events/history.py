"""When each block came and went: the index's memory of time, for the miss ledger.

The index (:mod:`.index`) says what a replica holds *now*. The ledger asks what it held
when a request was sent, which may be a moment or a few seconds ago, and whether a block
it lacked had been there and was removed. So, per replica and medium, the index keeps

- for each resident content key, when it became resident (the gateway's wall clock when
  the batch that stored it was applied: one clock with the records' ``received_at``);
- for the ``max_removals`` blocks removed most recently, their last few residencies (when
  stored, when removed): a block may come and go several times while a request waits for
  its ledger (what the caps push out is counted; a block removed longer ago than the
  oldest kept removal reads as never seen);
- the times of the engine's last ``max_clears`` cache clears (``AllBlocksCleared``: a
  flush, a reset, a restart): a removal at one of them was the clear, not an eviction
  (:attr:`BlockAt.cleared`; a block the engine evicted in the very batch that cleared
  reads as cleared too);
- ``since``: from when on the history is continuous (the first batch applied after the
  subscriber started or lost track of the stream). A question about an earlier time has
  no answer (the ledger's ``unknown``).

Times are those at which the gateway applied each batch, so "resident at ``t``" is what a
lookup in the index at ``t`` would have found: the state a request sent at ``t`` was
routed against, without a snapshot taken on the request path.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["BlockHistory", "BlockAt"]

ContentKey = bytes
RESIDENCIES = 4  # past residencies kept per removed block
CLEARS = 64  # cache clears whose times are kept


class BlockAt(tuple):
    """One block at one time: ``gpu`` (resident in the GPU medium), ``host`` (resident in
    another medium: a host tier), ``removed_at`` (its latest removal known, before or after
    the time asked; ``None``: none kept), ``cleared`` (that removal was the engine clearing
    its cache, not an eviction)."""

    __slots__ = ()

    def __new__(
        cls, gpu: bool, host: bool, removed_at: float | None, cleared: bool = False
    ) -> BlockAt:
        return tuple.__new__(cls, (gpu, host, removed_at, cleared))

    @property
    def gpu(self) -> bool:
        return self[0]

    @property
    def host(self) -> bool:
        return self[1]

    @property
    def removed_at(self) -> float | None:
        return self[2]

    @property
    def cleared(self) -> bool:
        return self[3]

    @property
    def held(self) -> bool:
        return self[0] or self[1]


class BlockHistory:
    """Store and removal times of one replica's blocks, per medium; bounded."""

    def __init__(self, max_removals: int = 100_000, max_clears: int = CLEARS) -> None:
        if max_removals < 1 or max_clears < 1:
            raise ValueError("max_removals and max_clears must be >= 1")
        self.max_removals = max_removals
        self.clears: deque[float] = deque(maxlen=max_clears)  # clear times, oldest first
        self.since: float | None = None
        self.forgotten = 0  # removals pushed out by the cap
        self._stored: dict[str, dict[ContentKey, float]] = {}
        # per medium: key -> its past residencies (stored_at, removed_at), oldest first
        self._removed: dict[str, OrderedDict[ContentKey, list[tuple[float, float]]]] = {}

    # -- updates (called by the index) ----------------------------------------------------

    def begin(self, now: float) -> None:
        """A batch is applied at ``now``: the history runs from the first one on."""
        if self.since is None:
            self.since = now

    def stored(self, medium: str, keys: Iterable[ContentKey], now: float) -> None:
        """``keys`` became resident in ``medium`` (a key already there keeps its time)."""
        times = self._stored.get(medium)
        if times is None:
            times = self._stored[medium] = {}
        setdefault = times.setdefault
        for k in keys:
            setdefault(k, now)

    def removed(self, medium: str, key: ContentKey, now: float) -> None:
        """The last copy of ``key`` left ``medium`` at ``now``."""
        times = self._stored.get(medium)
        at = times.pop(key, None) if times is not None else None
        gone = self._removed.get(medium)
        if gone is None:
            gone = self._removed[medium] = OrderedDict()
        past = gone.get(key)
        if past is None:
            past = gone[key] = []
        else:
            gone.move_to_end(key)
            if len(past) >= RESIDENCIES:
                del past[0]
        past.append((now if at is None else at, now))
        if len(gone) > self.max_removals:
            gone.popitem(last=False)
            self.forgotten += 1

    def dropped(self, medium: str, key: ContentKey) -> None:
        """The index's cap pushed ``key`` out of ``medium`` (not a removal by the engine)."""
        times = self._stored.get(medium)
        if times is not None:
            times.pop(key, None)

    def cleared(self, resident: dict[str, Iterable[ContentKey]], now: float) -> None:
        """The engine cleared its cache: every resident block was removed at ``now``."""
        if not self.clears or self.clears[-1] != now:
            self.clears.append(now)
        for medium, keys in resident.items():
            for k in list(keys):
                self.removed(medium, k, now)
        self._stored.clear()

    def reset(self) -> None:
        """Continuity lost (the subscriber forgot the stream): nothing before the next
        batch can be answered."""
        self.since = None
        self._stored.clear()
        self._removed.clear()
        self.clears.clear()

    # -- queries --------------------------------------------------------------------------

    def removals(self, medium: str) -> Mapping[ContentKey, Any]:
        """The keys of ``medium`` with a removal kept (a key not in it has none: read
        only, for a caller that skips :meth:`at` for such keys)."""
        return self._removed.get(medium) or {}

    def covers(self, t: float) -> bool:
        return self.since is not None and self.since <= t

    def at(
        self, medium: str, key: ContentKey, t: float, resident_now: bool
    ) -> tuple[bool, float | None]:
        """Whether ``key`` was resident in ``medium`` at ``t``, and when it was removed:
        resident, the end of that residency (``None``: still resident); not resident, its
        latest removal before ``t`` (else its latest kept, or ``None``)."""
        if resident_now:
            times = self._stored.get(medium)
            since = times.get(key) if times is not None else None
            if since is None or since <= t:
                return True, None
        gone = self._removed.get(medium)
        past = gone.get(key) if gone is not None else None
        if not past:
            return False, None
        before = None
        for stored_at, removed_at in past:
            if stored_at <= t < removed_at:
                return True, removed_at
            if removed_at <= t:
                before = removed_at
        return False, past[-1][1] if before is None else before

    def was_clear(self, removed_at: float | None) -> bool:
        """Whether a removal at ``removed_at`` was a cache clear (one of the kept clears)."""
        return removed_at is not None and removed_at in self.clears

    def stored_times(self, medium: str) -> dict[ContentKey, float]:
        """When each resident key of ``medium`` became resident (read only)."""
        return self._stored.get(medium) or {}

    @property
    def media(self) -> tuple[str, ...]:
        """The media with removals kept."""
        return tuple(self._removed)

    def sizes(self) -> dict[str, int]:
        """Removals kept per medium."""
        return {m: len(r) for m, r in self._removed.items()}
