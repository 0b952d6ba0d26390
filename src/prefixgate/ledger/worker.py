"""The ledger worker: each finished request's miss ledger, computed off the request path.

:meth:`LedgerWorker.feed` is what a record's finish calls (after the record went to its
writer): it appends the record and the request as sent upstream to a bounded queue and
returns. A background task takes them in order, one per turn of the event loop, and

1. for a channel with ``kv_events``: asks for the prompt's token ids (the channel's own
   tokenizer and template when it names one, ``events/tokens.py``; else the replica's
   ``POST /tokenize``, a round trip off the request path), reads every replica's blocks
   *as of the request's time* from the index's history (:meth:`ReplicaIndex.blocks_at`:
   the times at which the gateway applied each batch, the same clock as the record's
   ``received_at``; no snapshot is taken while the request is served) and splits
   (``source: events``); a replica whose stream does not cover that time leaves what did
   not hit ``unknown``;
2. for any channel: runs the cache model on the record's segments
   (:mod:`.cachemodel`): its prediction of the hit, and for a channel without events the
   split itself (``source: model``);
3. keeps the session's prompt length and segments for its next request (where the prompt
   changed), bounded;
4. counts the tokens per cause and the predictions that agree with the engine (read by
   ``/metrics``), and writes the ledgers to the store in batches, in a thread: a batch
   once it holds ``batch_size`` ledgers or ``flush_interval`` after its first came, so
   the turns finished within that interval share one transaction. Given the record
   writer of the same store (``writer``), each ledger is handed to it as it is
   computed instead, and written in the transaction of the writer's next batch (the
   turn's record is in it: the writer waits for its batch to fill meanwhile).

Ledgers are derived data: a crash loses the ones not yet written (their records are safe
in the journal), and a full queue drops new requests' ledgers (counted), never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from prefixgate.apis.messages.request import plain
from prefixgate.cache.blocks import hash_blocks, hit_tokens_cap
from prefixgate.config import ChannelConfig, Config
from prefixgate.record.record import Record, Segment
from prefixgate.record.segments import FirstChange, first_changed, prefix_tokens
from prefixgate.record.writer import CallThread
from prefixgate.sequences import common_prefix
from prefixgate.store.base import Store
from prefixgate.wake import Wake

from .cachemodel import CAPACITY_TOKENS, ReplicaModels
from .causes import CAUSES, EVENTS, MODEL, Ledger
from .split import Split, split_events, split_model

if TYPE_CHECKING:
    from prefixgate.routing.prefix import PromptBlocks

log = logging.getLogger("prefixgate.ledger")
_SLICE = 512  # blocks looked up in the index per turn of the event loop

__all__ = ["Calibration", "LedgerWorker"]


# Called with a request's ledger once it is computed, or with None when it has none.
Then = Callable[[Ledger | None], None] | None


def _call(then: Then, ledger: Ledger | None) -> None:
    if then is not None:
        try:
            then(ledger)
        except Exception:  # whoever waits must never break the worker
            log.exception("a ledger's callback failed")


@dataclass
class Calibration:
    """One channel's predictions of the hit against the engine's reported figure."""

    requests: int = 0  # with the engine's cached_tokens
    index_requests: int = 0
    index_agree: int = 0
    model_requests: int = 0
    model_agree: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))

    def note(self, ledger: Ledger) -> None:
        for c in CAUSES:
            self.tokens[c] += getattr(ledger, c)
        if ledger.engine_cached is None:
            return
        self.requests += 1
        if ledger.index_predicted is not None:
            self.index_requests += 1
            self.index_agree += ledger.index_predicted == ledger.engine_cached
        if ledger.model_predicted is not None:
            self.model_requests += 1
            self.model_agree += ledger.model_predicted == ledger.engine_cached


@dataclass(slots=True)
class _Previous:
    prompt_tokens: int
    segments: list[Segment] | None


def _first_changed(prev: list[Segment], cur: list[Segment]) -> FirstChange | None:
    """:func:`~prefixgate.record.segments.first_changed`, the leading segments equal to
    the previous request's passed in one step (compared whole, in C)."""
    j = common_prefix(prev, cur)
    if j == len(prev) or j == len(cur):
        return None
    change = first_changed(prev[j:], cur[j:])
    if change is None:
        return None
    index = j + change.index
    return FirstChange(index, prefix_tokens(cur[:index]))


def _segment_at(segments: list[Segment], token: int, prompt_tokens: int) -> int:
    """The index of the segment that holds the prompt's ``token`` (segment sizes are
    estimates, scaled to the real prompt)."""
    total = sum(s.tokens for s in segments if s.kind != "tool") or 1
    at, seen = token * total / max(prompt_tokens, 1), 0
    for i, s in enumerate(segments):
        if s.kind == "tool":
            continue
        seen += s.tokens
        if seen > at:
            return i
    return len(segments) - 1


class LedgerWorker:
    def __init__(
        self,
        config: Config,
        *,
        events: Any = None,  # EngineEvents, or None
        store: Callable[[], Store] | None = None,
        engine_tokens: Any = None,  # EngineTokens (its own: its session cache is the ledger's)
        upstream: Any = None,  # the gateway's Upstream, for POST /tokenize
        orders: Any = None,  # the gateway's RenderOrders (its own engine tokens' templates)
        queue_max: int = 10_000,
        batch_size: int = 200,
        flush_interval: float = 0.5,
        retry_interval: float = 5.0,
        sessions_max: int = 20_000,
        model_capacity_tokens: int = CAPACITY_TOKENS,
        keep_recent: int = 1000,
        writer: Any = None,  # the gateway's RecordWriter, when it writes to the same store
    ) -> None:
        self.channels = {ch.name: ch for ch in config.channels}
        self.events = events
        self._factory = store
        self._store: Store | None = None
        self._migrated = False
        self.upstream = upstream
        if engine_tokens is None and any(ch.kv_events for ch in config.channels):
            from prefixgate.events.tokens import EngineTokens

            engine_tokens = EngineTokens(config.channels, orders=orders)
        self.tokens = engine_tokens
        self.queue_max, self.batch_size = queue_max, batch_size
        self.flush_interval, self.retry_interval = flush_interval, retry_interval
        self.sessions_max = sessions_max
        self.model_capacity_tokens = model_capacity_tokens
        # each: the record, the request as sent upstream, who waits for its ledger, and
        # its routing's blocks
        self._queue: deque[tuple[Record, dict | None, Then, PromptBlocks | None]] = deque()
        self._pending: list[Ledger] = []
        self._sessions: OrderedDict[tuple[str, str], _Previous] = OrderedDict()
        # per session and channel: its last prompt's token ids and content keys (remote ids)
        self._ids: OrderedDict[tuple[str, str], tuple[np.ndarray, list[bytes], int]] = OrderedDict()
        # the last prompt's first token that differs from its session's previous one, and
        # whether that is before the previous one's end (None: no previous tokens known)
        self._token_change: tuple[int, bool] | None = None
        self._models: dict[str, ReplicaModels] = {}
        self.calibration: dict[str, Calibration] = {}
        self.recent: deque[Ledger] = deque(maxlen=keep_recent)
        self.computed = self.dropped = self.failed = self.written = self.lost = 0
        self.token_mismatches = 0  # token ids whose count differs from prompt_tokens
        self._wake = Wake()
        self._task: asyncio.Task | None = None
        self._thread: CallThread | None = None
        self._retry_at = 0.0
        self._closing = False
        self._hurry = False  # drain(): write what is pending now
        self.writer = writer

    # -- the request path -----------------------------------------------------------------
    def feed(
        self,
        record: Record,
        request: dict | None,
        then: Then = None,
        blocks: PromptBlocks | None = None,
    ) -> None:
        """A finished request (called by its finish): queued, nothing computed here.
        ``then`` is called with its ledger once computed, or with None when there is none
        (no prompt figure, the queue full, a failure, the worker stopped). ``blocks``: its
        routing's blocks (when they are the engine's content keys, the ledger does not
        compute them again)."""
        if record.prompt_tokens is None or record.channel is None:
            _call(then, None)
            return
        if len(self._queue) >= self.queue_max:
            self.dropped += 1
            _call(then, None)
            return
        self._queue.append((record, request, then, blocks))
        self._wake.set()

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="prefixgate-ledger")

    async def aclose(self, timeout: float = 2.0) -> None:
        """Compute what is queued and write it, within ``timeout``; then stop."""
        task, self._task = self._task, None
        if task is not None:
            self._closing = True
            self._wake.set()
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(task)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            while self._queue:  # not computed in time: those waiting hear of no ledger
                _call(self._queue.popleft()[2], None)
        if self._thread is not None:
            if self._store is not None:
                store, self._store = self._store, None
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(1.0):
                        await self._thread.call(store.close)
            self._thread.stop()
            self._thread = None

    async def drain(self) -> None:
        """Until everything fed so far is computed and written (tests, benchmarks): what
        is pending is written without waiting out ``flush_interval``."""
        while self._queue or self._pending or (self.writer and self.writer.ledgers_pending):
            self._hurry = True
            self._wake.set()
            await asyncio.sleep(0.01)
        self._hurry = False

    async def _run(self) -> None:
        # A batch is written once it is full, or ``flush_interval`` after its first
        # ledger: the turns that finish within it (sessions served side by side, a
        # client's requests in a burst) share one transaction.
        first = 0.0  # when the oldest ledger pending came
        while True:
            if not self._queue:
                if self._closing:
                    await self._flush()
                    return
                self._wake.clear()
                timeout = None
                if self._pending:
                    now = time.monotonic()
                    due = max(now if self._hurry else first + self.flush_interval, self._retry_at)
                    timeout = max(0.0, due - now)
                await self._wake.wait(timeout)  # None: nothing pending, until fed
            if self._queue:
                record, request, then, blocks = self._queue.popleft()
                try:
                    ledger = await self.compute(record, request, blocks)
                except Exception:  # a bug costs one ledger, never the worker
                    log.exception("ledger of request %s failed", record.request_id)
                    self.failed += 1
                    ledger = None
                if ledger is not None:
                    self._done(ledger, record.channel or "-")
                _call(then, ledger)
                if self._queue:  # one request a turn: the loop serves requests first
                    await asyncio.sleep(0)
            if not self._pending:
                continue
            now = time.monotonic()
            if not first:
                first = now
            full = len(self._pending) >= self.batch_size or self.writer is not None
            if (full or self._hurry or now - first >= self.flush_interval) and (
                now >= self._retry_at
            ):
                await self._flush()
                first = 0.0 if not self._pending else time.monotonic()

    def _done(self, ledger: Ledger, channel: str) -> None:
        self.computed += 1
        self.recent.append(ledger)
        self.calibration.setdefault(channel, Calibration()).note(ledger)
        if self._factory is not None:
            self._pending.append(ledger)
            if len(self._pending) > self.queue_max:
                del self._pending[0]
                self.lost += 1

    # -- the store ------------------------------------------------------------------------
    async def _flush(self) -> None:
        if not self._pending or self._factory is None:
            return
        batch, self._pending = self._pending, []
        if self.writer is not None and self.writer.take_ledgers(batch, self._settled):
            return  # written in the transaction of the writer's next batch
        if self._thread is None:
            self._thread = CallThread("prefixgate-ledgers", lowered=True)
        try:
            await self._thread.call(self._write, batch)
        except Exception as exc:
            if not self._retry_at:
                log.warning("ledgers not stored (will retry): %s", exc)
            self._retry_at = time.monotonic() + self.retry_interval
            self._pending = batch + self._pending
            overflow = len(self._pending) - self.queue_max
            if overflow > 0:
                del self._pending[:overflow]
                self.lost += overflow
            return
        self._retry_at = 0.0
        self.written += len(batch)

    def _settled(self, written: int, lost: int) -> None:
        self.written += written
        self.lost += lost

    def _write(self, batch: list[Ledger]) -> None:
        if self._store is None:
            assert self._factory is not None
            self._store = self._factory()
            self._migrated = False
        try:
            if not self._migrated:
                self._store.migrate()
                self._migrated = True
            self._store.write_ledgers(batch)
        except Exception:
            store, self._store = self._store, None
            with contextlib.suppress(Exception):
                store.close()
            raise

    # -- one ledger -----------------------------------------------------------------------
    async def compute(
        self, rec: Record, request: dict | None, blocks: PromptBlocks | None = None
    ) -> Ledger | None:
        """The ledger of one finished request (None when it has no prompt tokens)."""
        ch = self.channels.get(rec.channel or "")
        L = rec.prompt_tokens
        if ch is None or not L or rec.replica is None:
            return None
        B = self._block_size(ch)
        previous = self._remember(rec)
        segments = rec.segments_out
        change = _first_changed(previous.segments, segments) if previous and segments else None
        models = self._models.get(ch.name)
        if models is None:
            models = self._models[ch.name] = ReplicaModels(
                capacity_tokens=self.model_capacity_tokens
            )
        session = rec.session_id
        view = models.see(rec.replica, segments, L, session) if segments else None
        cap = hit_tokens_cap(L, B)
        model_predicted = None if view is None else min(view.here, cap) // B * B
        prev_tokens = previous.prompt_tokens if previous else None
        if ch.kv_events is not None and self.events is not None and ch.kind == "openai":
            split = await self._from_events(
                ch, rec, request, B, prev_tokens, change is not None, blocks
            )
            source = EVENTS
        else:
            changed_at = None
            if change is not None and view is not None:
                changed_at = round(change.offset * view.scale)
            split = split_model(
                prompt_tokens=L,
                block_size=B,
                cached=rec.cached_tokens,
                here=None if view is None else view.here,
                best=None if view is None else view.best,
                best_replica=None if view is None else view.best_replica,
                previous_tokens=prev_tokens,
                changed_at=changed_at,
            )
            source = MODEL
        name = index = None
        if change is not None and split.parts.get("prefix_changed") and segments:
            index = change.index
            name = segments[index].name if index < len(segments) else None
        elif split.parts.get("prefix_changed") and segments and self._token_change:
            # only the engine's tokens show the change: the segment at that token
            index = _segment_at(segments, self._token_change[0], L)
            name = segments[index].name
        return Ledger(
            request_id=rec.request_id,
            received_at=rec.received_at,
            source=source,
            prompt_tokens=L,
            block_size=B,
            **split.parts,
            changed_segment=name,
            changed_index=index,
            elsewhere_replica=split.elsewhere_replica,
            engine_cached=rec.cached_tokens,
            index_predicted=split.index_predicted,
            model_predicted=model_predicted,
            host_hit=split.host_hit,
            host_missed=split.host_missed,
            cleared=split.cleared,
        )

    def _block_size(self, ch: ChannelConfig) -> int:
        if self.events is not None and ch.kv_events is not None:
            size = self.events.block_size(ch.name)
            if size:
                return size
        if ch.kv_events is not None and ch.kv_events.block_size:
            return ch.kv_events.block_size
        return ch.routing.block_size

    async def _session_keys(self, rec: Record, ids: list[int], B: int) -> list[bytes]:
        """Content keys of ``ids``, the blocks shared with the session's previous prompt
        taken from it (a turn hashes its new tail only)."""
        arr = np.asarray(ids, dtype=np.int64)
        key = (rec.session_id, rec.channel or "") if rec.session_id is not None else None
        prev = self._ids.pop(key, None) if key is not None else None
        old: list[bytes] = []
        self._token_change = None
        if prev is not None:
            n = min(len(prev[0]), len(arr))
            diff = np.flatnonzero(prev[0][:n] != arr[:n])
            at = int(diff[0]) if len(diff) else n
            # the engine's prompt changed before the previous one's end: at token ``at``
            self._token_change = (at, at < len(prev[0]))
            if prev[2] == B:
                old = prev[1][: at // B]
        keys = list(old)
        step = _SLICE * B
        for start in range(len(keys) * B, len(arr) - B + 1, step):  # a slice a loop turn
            keys += hash_blocks(arr[start : start + step], B, parent=keys[-1] if keys else None)
            await asyncio.sleep(0)
        if key is not None:
            self._ids[key] = (arr, keys, B)
            while len(self._ids) > self.sessions_max // 10:
                self._ids.popitem(last=False)
        return keys

    def _keep_ids(self, rec: Record, ids, keys: list[bytes], B: int) -> None:
        """The session's token ids kept for its next prompt (keys computed elsewhere), and
        where this prompt's tokens first differ from the previous one's."""
        arr = np.asarray(ids, dtype=np.int64)
        key = (rec.session_id, rec.channel or "") if rec.session_id is not None else None
        prev = self._ids.pop(key, None) if key is not None else None
        self._token_change = None
        if prev is not None:
            n = min(len(prev[0]), len(arr))
            diff = np.flatnonzero(prev[0][:n] != arr[:n])
            at = int(diff[0]) if len(diff) else n
            self._token_change = (at, at < len(prev[0]))
        if key is not None:
            self._ids[key] = (arr, keys, B)
            while len(self._ids) > self.sessions_max // 10:
                self._ids.popitem(last=False)

    def _remember(self, rec: Record) -> _Previous | None:
        """The session's previous request on this channel; this one kept in its place."""
        if rec.session_id is None:
            return None
        key = (rec.session_id, rec.channel or "")
        prev = self._sessions.pop(key, None)
        self._sessions[key] = _Previous(rec.prompt_tokens or 0, rec.segments_out)
        while len(self._sessions) > self.sessions_max:
            self._sessions.popitem(last=False)
        return prev

    async def _from_events(
        self,
        ch: ChannelConfig,
        rec: Record,
        request: dict | None,
        B: int,
        prev_tokens: int | None,
        changed: bool,
        blocks: PromptBlocks | None = None,
    ) -> Split:
        L = rec.prompt_tokens or 0
        t = rec.received_at
        t_end = rec.first_byte_at or rec.done_at or t
        self._token_change = None
        keys = await self._keys(ch, rec, request, B, blocks)
        if self._token_change is not None:
            # the engine's tokens against the session's previous prompt: whatever moved
            # them (a template that re-orders, a re-rendered turn), not the request's order
            changed = self._token_change[1]
        ev = self.events
        index = ev.channels[ch.name].index if ch.name in ev.channels else None
        mine = others = None
        if keys is not None and index is not None:
            limit = hit_tokens_cap(L, B) // B
            keys = keys[:limit]
            others = {}
            for url, replica in index.replicas().items():
                if not (ev.usable(ch.name, url) and replica.history.covers(t)):
                    continue
                blocks = []
                for i in range(0, len(keys), _SLICE):  # the loop serves requests between
                    blocks += replica.blocks_at(keys[i : i + _SLICE], t)
                    await asyncio.sleep(0)
                if url == rec.replica:
                    mine = blocks
                else:
                    others[url] = blocks
        return split_events(
            prompt_tokens=L,
            block_size=B,
            cached=rec.cached_tokens,
            mine=mine,
            others=others or {},
            t=t,
            t_end=t_end,
            previous_tokens=prev_tokens,
            changed=changed,
        )

    async def _keys(
        self,
        ch: ChannelConfig,
        rec: Record,
        request: dict | None,
        B: int,
        known: PromptBlocks | None = None,
    ) -> list[bytes] | None:
        """The content keys of the prompt's full blocks, or None when its tokens cannot
        be had (logged at debug level; the ledger then says ``unknown``). ``known``: the
        keys routing computed for this request (the same function of the same request)."""
        if known is not None and known.engine_tokens is not None and known.block_size == B:
            if known.engine_tokens != rec.prompt_tokens:
                self.token_mismatches += 1
            return list(known.hashes)
        if request is None or self.tokens is None:
            return None
        from prefixgate.events.tokens import EngineTokensError

        body = plain(request)
        try:
            if ch.tokenizer != "approx" or ch.chat_template:
                ids, keys = self.tokens.content_keys(ch, body, B, session=rec.session_id)
                n = len(ids)
                self._keep_ids(rec, ids, keys, B)
            else:
                if self.upstream is None:
                    return None
                got = await self.tokens.remote_token_ids(ch, body, rec.replica, self.upstream)
                n, keys = len(got), await self._session_keys(rec, got, B)
        except EngineTokensError as exc:
            log.debug("ledger of %s: no token ids: %s", rec.request_id, exc)
            return None
        if n != rec.prompt_tokens:
            self.token_mismatches += 1
        return keys
