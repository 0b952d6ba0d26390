"""What each replica's engine has cached, per medium, keyed by content.

Engines name blocks by a hash seeded per process (vLLM's ``PYTHONHASHSEED``-like random
seed), so the index re-keys every block by its content: the chained hash of its token ids
after its parent's content key, the cache model's own hash (:func:`content_keys`, which is
:func:`prefixgate.cache.hash_blocks`). A request's blocks get the same keys from its token
ids, whatever seed the engine drew, and one truth about block hashing holds across the
cache model, the prefix router's estimate and the engine's events.

Per replica, :class:`ReplicaIndex` keeps

- the engine hash -> content key map, to resolve a stored block's parent and to apply
  ``BlockRemoved`` (which names engine hashes only);
- per medium (``GPU``; ``CPU`` and the like for a host tier), the content keys resident
  there with their number of copies: vLLM may hold two blocks with one hash (the last-token
  rule recomputes a cached block) and announces each store and each removal, so a count,
  not a set, ends equal to the engine's state.

Memory is bounded: at most ``max_blocks`` keys per medium and twice that in the hash map,
each an LRU (a store refreshes an entry, so does a lookup that matched it); what the caps
push out is counted in ``dropped``. Each replica also keeps a :class:`~.history.BlockHistory`
(when each block was stored, the recent removals: :meth:`ReplicaIndex.blocks_at` answers
for a past time, which the miss ledger needs). Blocks whose hash mixed in more than tokens (a LoRA, a
multimodal item, a ``cache_salt``) get keys no plain token sequence produces: they are
indexed but never predicted for a request without them. Only the first KV-cache group
(``group_idx`` 0 or absent: full attention) is indexed; events of other groups are counted
in ``skipped_group_blocks``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from operator import indexOf

import msgspec

from prefixgate.cache.blocks import DIGEST_SIZE, Tokens, hash_blocks

from .history import BlockAt, BlockHistory
from .wire import GPU_MEDIUM, AllBlocksCleared, BlockRemoved, BlockStored, Event

__all__ = ["GPU", "EventIndex", "IndexCounters", "PrefixHit", "ReplicaIndex", "content_keys"]

GPU = GPU_MEDIUM
_HELD = BlockAt(True, False, None)
_NEVER = BlockAt(False, False, None)
ContentKey = bytes
_EXTRA = msgspec.msgpack.Encoder()


def content_keys(token_ids: Tokens, block_size: int) -> list[ContentKey]:
    """The content keys of the FULL blocks of a prompt (the partial last block has none):
    what the index is keyed by, so ``longest_prefix(replica, content_keys(ids, B))`` is
    the number of leading blocks the engine holds."""
    return hash_blocks(token_ids, block_size)


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """Leading blocks of a request found cached: ``blocks`` counts blocks each held in
    some medium (a GPU prefix continued by host-tier blocks); ``by_medium`` each medium
    on its own."""

    blocks: int
    by_medium: dict[str, int] = field(default_factory=dict)

    @property
    def gpu(self) -> int:
        return self.by_medium.get(GPU, 0)


@dataclass(slots=True)
class IndexCounters:
    """What the index did with the events it was given."""

    stored_blocks: int = 0
    removed_blocks: int = 0
    clears: int = 0
    orphan_blocks: int = 0  # stored after a parent the index never saw: not indexable
    unknown_removals: int = 0  # removals of blocks the index does not hold
    skipped_group_blocks: int = 0  # other KV-cache groups (sliding window, draft)
    malformed_events: int = 0  # token ids that do not fill the announced blocks
    size_mismatch_blocks: int = 0  # blocks of another block size than the index's
    dropped: int = 0  # entries pushed out by the caps


class ReplicaIndex:
    """The blocks one replica's engine holds, per medium; fed with decoded events."""

    def __init__(
        self,
        max_blocks: int = 200_000,
        block_size: int | None = None,
        history: BlockHistory | None = None,
    ) -> None:
        if max_blocks < 1:
            raise ValueError("max_blocks must be >= 1")
        self.max_blocks = max_blocks
        self.block_size = block_size
        self.block_size_error: str | None = None
        self.counters = IndexCounters()
        self.history = BlockHistory() if history is None else history
        self._by_hash: OrderedDict[Hashable, ContentKey] = OrderedDict()
        self._media: dict[str, OrderedDict[ContentKey, int]] = {}
        self._now = 0.0  # when the batch being applied arrived (wall clock)

    # -- queries --------------------------------------------------------------------------

    def __len__(self) -> int:
        """Resident entries over all media."""
        return sum(len(r) for r in self._media.values())

    @property
    def media(self) -> tuple[str, ...]:
        return tuple(self._media)

    def sizes(self) -> dict[str, int]:
        """Resident entries per medium."""
        return {name: len(r) for name, r in self._media.items()}

    def resident(self, medium: str = GPU) -> dict[ContentKey, int]:
        """A copy of one medium's content keys and their number of copies."""
        return dict(self._media.get(medium, {}))

    def longest_prefix(self, keys: Sequence[ContentKey], *, touch: bool = True) -> PrefixHit:
        """Leading ``keys`` cached, per medium and in any medium. ``touch`` refreshes the
        matched entries in the LRU (a hit keeps a block, as in the engine)."""
        runs: dict[str, int] = {}
        for name, resident in self._media.items():
            try:  # the first key not resident, found without a Python-level loop
                n = indexOf(map(resident.__contains__, keys), False)
            except ValueError:
                n = len(keys)
            runs[name] = n
            if touch:
                move = resident.move_to_end
                for k in keys[:n]:
                    move(k)
        n = max(runs.values(), default=0)
        if len(self._media) > 1:
            media = list(self._media.values())
            while n < len(keys) and any(keys[n] in r for r in media):
                n += 1
        return PrefixHit(n, runs)

    def blocks_at(self, keys: Sequence[ContentKey], t: float) -> list[BlockAt]:
        """Each of ``keys`` as it was at ``t`` (wall clock): resident on the GPU, in a host
        tier, and its latest removal known. Ask only when ``history.covers(t)``."""
        hist = self.history
        empty: dict[ContentKey, int] = {}
        names = {*self._media, *hist.media}
        if names <= {GPU}:  # the common case, one medium: no call for a block held since
            resident = self._media.get(GPU, empty)
            since = hist.stored_times(GPU)
            removed = hist.removals(GPU)
            kept, cold = _HELD, _NEVER
            out = []
            for k in keys:
                if k in resident:
                    at = since.get(k)
                    if at is None or at <= t:
                        out.append(kept)
                        continue
                elif k not in removed:  # never held, or its removals forgotten
                    out.append(cold)
                    continue
                held, gone = hist.at(GPU, k, t, k in resident)
                out.append(BlockAt(held, False, gone, hist.was_clear(gone)))
            return out
        media = [(m, self._media.get(m, empty)) for m in names]
        out = []
        for k in keys:
            gpu = host = False
            removed_at = None
            for name, resident in media:
                held, gone = hist.at(name, k, t, k in resident)
                if held:
                    if name == GPU:
                        gpu = True
                    else:
                        host = True
                if gone is not None and (removed_at is None or gone > removed_at):
                    removed_at = gone
            out.append(BlockAt(gpu, host, removed_at, hist.was_clear(removed_at)))
        return out

    # -- updates --------------------------------------------------------------------------

    def apply(self, events: Iterable[Event], now: float | None = None) -> None:
        """Apply decoded events in order, as arrived at ``now`` (default: the wall clock)."""
        self._now = now = time.time() if now is None else now
        self.history.begin(now)
        for ev in events:
            if isinstance(ev, BlockStored):
                self._store(ev)
            elif isinstance(ev, BlockRemoved):
                self._remove(ev)
            elif isinstance(ev, AllBlocksCleared):
                self.history.cleared(self._media, now)
                self.clear()
                self.counters.clears += 1

    def clear(self) -> None:
        """Forget everything (the engine reset its cache, or restarted)."""
        self._by_hash.clear()
        self._media.clear()

    def _store(self, ev: BlockStored) -> None:
        c = self.counters
        hashes = ev.block_hashes
        if ev.group_idx:
            c.skipped_group_blocks += len(hashes)
            return
        if ev.token_ids:
            keys = self._keys_from_tokens(ev)
            if keys is None:
                return
            by_hash = self._by_hash
            for h, k in zip(hashes, keys, strict=True):
                by_hash[h] = k
                by_hash.move_to_end(h)
            while len(by_hash) > 2 * self.max_blocks:
                by_hash.popitem(last=False)
                c.dropped += 1
        else:  # a host-tier copy of blocks already known by their first store
            found = [self._by_hash.get(h) for h in hashes]
            keys = [k for k in found if k is not None]
            c.orphan_blocks += len(found) - len(keys)
        medium = ev.medium or GPU
        resident = self._media.get(medium)
        if resident is None:
            resident = self._media[medium] = OrderedDict()
        for k in keys:
            resident[k] = resident.get(k, 0) + 1
            resident.move_to_end(k)
        c.stored_blocks += len(keys)
        self.history.stored(medium, keys, self._now)
        while len(resident) > self.max_blocks:
            k, _ = resident.popitem(last=False)
            self.history.dropped(medium, k)
            c.dropped += 1

    def _keys_from_tokens(self, ev: BlockStored) -> list[ContentKey] | None:
        c = self.counters
        n, size = len(ev.block_hashes), ev.block_size
        if self.block_size is None and size > 0:
            self.block_size = size
        if size != self.block_size:
            c.size_mismatch_blocks += n
            self.block_size_error = (
                f"the engine stores blocks of {size} tokens, the index expects {self.block_size}"
            )
            return None
        if len(ev.token_ids) != n * size:
            c.malformed_events += 1
            return None
        parent: bytes | None = None
        if ev.parent_block_hash is not None:
            parent = self._by_hash.get(ev.parent_block_hash)
            if parent is None:
                c.orphan_blocks += n
                return None
        extras = _extras(ev)
        if extras is None:
            return hash_blocks(ev.token_ids, size, parent=parent)
        keys: list[ContentKey] = []
        tokens = ev.token_ids
        for i, extra in enumerate(extras):
            (k,) = hash_blocks(tokens[i * size : (i + 1) * size], size, parent=parent)
            if extra is not None:
                k = blake2b(k + _EXTRA.encode(extra), digest_size=DIGEST_SIZE).digest()
            keys.append(k)
            parent = k
        return keys

    def _remove(self, ev: BlockRemoved) -> None:
        c = self.counters
        if ev.group_idx:
            c.skipped_group_blocks += len(ev.block_hashes)
            return
        medium = ev.medium or GPU
        resident = self._media.get(medium)
        by_hash = self._by_hash
        for h in ev.block_hashes:
            k = by_hash.get(h)
            count = None if (k is None or resident is None) else resident.get(k)
            if count is None:
                c.unknown_removals += 1
                continue
            c.removed_blocks += 1
            if count > 1:
                resident[k] = count - 1  # type: ignore[index]
                continue
            del resident[k]
            self.history.removed(medium, k, self._now)
            if not any(k in r for r in self._media.values()):
                del by_hash[h]


def _extras(ev: BlockStored) -> list[object] | None:
    """Per block, what its engine hash mixed in besides tokens; ``None`` if nothing."""
    lora = ev.lora_name if ev.lora_name is not None else ev.lora_id
    per_block = ev.extra_keys or ()
    if lora is None and all(x is None for x in per_block):
        return None
    n = len(ev.block_hashes)
    keys = list(per_block)[:n] + [None] * max(0, n - len(per_block))
    return [None if (lora is None and x is None) else [lora, x] for x in keys]


class EventIndex:
    """The replicas of one channel: a :class:`ReplicaIndex` each, one block size."""

    def __init__(
        self,
        max_blocks: int = 200_000,
        block_size: int | None = None,
        history_blocks: int = 100_000,
    ) -> None:
        self.max_blocks = max_blocks
        self.history_blocks = history_blocks
        self._block_size = block_size
        self._replicas: dict[str, ReplicaIndex] = {}

    @property
    def block_size(self) -> int | None:
        """The configured block size, or the one the first stored block showed."""
        return self._block_size

    def replica(self, name: str) -> ReplicaIndex:
        r = self._replicas.get(name)
        if r is None:
            history = BlockHistory(self.history_blocks)
            r = self._replicas[name] = ReplicaIndex(self.max_blocks, self._block_size, history)
        return r

    def replicas(self) -> dict[str, ReplicaIndex]:
        return dict(self._replicas)

    def apply(self, replica: str, events: Iterable[Event], now: float | None = None) -> None:
        r = self.replica(replica)
        if r.block_size is None:
            r.block_size = self._block_size
        r.apply(events, now)
        if self._block_size is None and r.block_size is not None:
            self._block_size = r.block_size

    def clear(self, replica: str) -> None:
        """Forget a replica's blocks and their history (the stream was lost)."""
        r = self.replica(replica)
        r.clear()
        r.history.reset()

    def longest_prefix(
        self, replica: str, keys: Sequence[ContentKey], *, touch: bool = True
    ) -> PrefixHit:
        r = self._replicas.get(replica)
        return PrefixHit(0) if r is None else r.longest_prefix(keys, touch=touch)

    def content_keys(self, token_ids: Tokens) -> list[ContentKey]:
        """:func:`content_keys` at this channel's block size (none known yet: no keys)."""
        return [] if self._block_size is None else content_keys(token_ids, self._block_size)
