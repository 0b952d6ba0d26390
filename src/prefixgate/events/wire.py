"""The wire of engine KV-cache events: three ZeroMQ frames around a msgpack batch.

A publisher (vLLM, SGLang, the simulated upstream) sends each batch of events as
``[topic, sequence number (8 bytes, big-endian), payload (msgpack)]``. The payload is one
batch, laid out one of three ways depending on the engine's release:

- ``map`` (vLLM 0.32): a positional batch ``[ts, [events], data_parallel_rank]`` whose
  events are maps tagged by ``"type"``;
- ``array`` (older vLLM, SGLang): a positional batch ``[ts, [events]]`` whose events are
  positional too, the tag first: ``["BlockStored", block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx, ...]``
  (older releases stop earlier; later ones add fields at the end);
- ``map-batch`` (newer vLLM): ``{"ts": ..., "events": [maps], "data_parallel_rank": ...}``.

:class:`WireDecoder` builds its msgspec decoders once and tries the layout that worked last
first (a publisher does not change layout mid-stream), so a batch costs one typed decode.
A batch the typed decoders refuse is taken apart event by event: an unknown event type or a
malformed event is counted and skipped, and the rest of its batch still counts. Only a
payload that is no batch at all raises :class:`WireError`.

Engine block hashes are u64 in vLLM (Python ints), bytes in some builds; both are kept as
they come, and only ever used as dictionary keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

__all__ = [
    "ENCODINGS",
    "END_SEQ",
    "AllBlocksCleared",
    "Batch",
    "BlockRemoved",
    "BlockStored",
    "Encoding",
    "Event",
    "WireDecoder",
    "WireError",
    "encode_batch",
    "pack_seq",
    "split_frames",
]

EngineHash = int | bytes
Encoding = Literal["map", "array", "map-batch"]
ENCODINGS: tuple[Encoding, ...] = ("map", "array", "map-batch")
END_SEQ = -1  # the replay socket's "no more batches" marker
GPU_MEDIUM = "GPU"  # vLLM's name for device memory; events without a medium are the GPU's


class WireError(ValueError):
    """A message or payload that is not an event batch in any known layout."""


# -- the events (map form: the tag is the "type" field) ---------------------------------


class BlockStored(msgspec.Struct, tag="BlockStored", tag_field="type", gc=False):
    """Full blocks an engine cached: ``len(block_hashes)`` blocks whose tokens are
    ``token_ids`` (``block_size`` each), chained after ``parent_block_hash``. A host-tier
    store may carry no tokens: it names blocks already known from their first store."""

    block_hashes: list[EngineHash]
    parent_block_hash: EngineHash | None = None
    token_ids: list[int] = []
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class BlockRemoved(msgspec.Struct, tag="BlockRemoved", tag_field="type", gc=False):
    """Blocks an engine dropped from one medium (one copy each)."""

    block_hashes: list[EngineHash]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type", gc=False):
    """The engine's prefix cache was reset."""


Event = BlockStored | BlockRemoved | AllBlocksCleared


# -- the same events, positional (older releases); subclasses, so isinstance holds -------


class _BlockStoredArray(BlockStored, array_like=True, tag="BlockStored"):
    pass


class _BlockRemovedArray(BlockRemoved, array_like=True, tag="BlockRemoved"):
    pass


class _AllBlocksClearedArray(AllBlocksCleared, array_like=True, tag="AllBlocksCleared"):
    pass


_MapEvent = BlockStored | BlockRemoved | AllBlocksCleared
_ArrayEvent = _BlockStoredArray | _BlockRemovedArray | _AllBlocksClearedArray
_KNOWN_TYPES = frozenset(("BlockStored", "BlockRemoved", "AllBlocksCleared"))


# -- the batch layouts --------------------------------------------------------------------


class _PosBatchMapEvents(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_MapEvent]
    data_parallel_rank: int | None = None


class _PosBatchArrayEvents(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_ArrayEvent]
    data_parallel_rank: int | None = None


class _MapBatchMapEvents(msgspec.Struct, gc=False):
    ts: float
    events: list[_MapEvent]
    data_parallel_rank: int | None = None


class _MapBatchArrayEvents(msgspec.Struct, gc=False):
    ts: float
    events: list[_ArrayEvent]
    data_parallel_rank: int | None = None


class _PosBatchLoose(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class _MapBatchLoose(msgspec.Struct, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class Batch(msgspec.Struct, gc=False):
    """One decoded batch: its events in order, and what was skipped in it."""

    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None
    layout: str = ""  # which layout decoded it ("map", "array", "map-batch", "mixed")
    unknown: int = 0  # events of a type this decoder does not know
    malformed: int = 0  # events of a known type whose fields do not fit
    unknown_types: tuple[str, ...] = ()


def _first_byte_kind(raw: bytes | memoryview) -> str:
    """'map', 'array' or '' from a msgpack value's first byte."""
    if not raw:
        return ""
    b = raw[0]
    if 0x80 <= b <= 0x8F or b in (0xDE, 0xDF):
        return "map"
    if 0x90 <= b <= 0x9F or b in (0xDC, 0xDD):
        return "array"
    return ""


class WireDecoder:
    """Decodes payloads of every layout; one per subscriber (it remembers the last layout)."""

    def __init__(self) -> None:
        dec = msgspec.msgpack.Decoder
        self._typed: dict[str, msgspec.msgpack.Decoder[Any]] = {
            "map": dec(_PosBatchMapEvents),
            "array": dec(_PosBatchArrayEvents),
            "map-batch": dec(_MapBatchMapEvents),
            "map-batch/array": dec(_MapBatchArrayEvents),
        }
        self._order: list[str] = list(self._typed)
        self._loose_pos = dec(_PosBatchLoose)
        self._loose_map = dec(_MapBatchLoose)
        self._map_event = dec(_MapEvent)
        self._array_event = dec(_ArrayEvent)
        self._any = dec()

    def decode(self, payload: bytes | memoryview) -> Batch:
        """The batch in ``payload``; :class:`WireError` if it is not a batch at all."""
        batch_kind = _first_byte_kind(payload)
        for layout in self._order:
            if (batch_kind == "map") != layout.startswith("map-batch"):
                continue
            try:
                got = self._typed[layout].decode(payload)
            except (msgspec.ValidationError, msgspec.DecodeError):
                continue
            if layout != self._order[0]:
                self._order.remove(layout)
                self._order.insert(0, layout)
            return Batch(got.ts, got.events, got.data_parallel_rank, layout)
        return self._decode_loose(payload, batch_kind)

    def _decode_loose(self, payload: bytes | memoryview, batch_kind: str) -> Batch:
        try:
            if batch_kind == "map":
                loose: Any = self._loose_map.decode(payload)
            elif batch_kind == "array":
                loose = self._loose_pos.decode(payload)
            else:
                raise WireError("payload is neither a msgpack array nor a map")
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise WireError(f"not an event batch: {exc}") from None
        batch = Batch(loose.ts, [], loose.data_parallel_rank, "mixed")
        unknown: list[str] = []
        for raw in loose.events:
            event = self._decode_event(raw)
            if event is not None:
                batch.events.append(event)
                continue
            name = self._type_name(raw)
            if name is not None and name not in _KNOWN_TYPES:
                batch.unknown += 1
                if name[:64] not in unknown:
                    unknown.append(name[:64])
            else:
                batch.malformed += 1
        batch.unknown_types = tuple(unknown)
        return batch

    def _decode_event(self, raw: msgspec.Raw) -> Event | None:
        kind = _first_byte_kind(memoryview(raw))
        if not kind:
            return None
        try:
            return (self._map_event if kind == "map" else self._array_event).decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return None

    def _type_name(self, raw: msgspec.Raw) -> str | None:
        try:
            value = self._any.decode(raw)
        except msgspec.DecodeError:
            return None
        if isinstance(value, dict):
            name = value.get("type")
        elif isinstance(value, list) and value:
            name = value[0]
        else:
            return None
        return name if isinstance(name, str) else None


# -- frames and encoding (the publisher's side) --------------------------------------------


def split_frames(frames: Sequence[bytes]) -> tuple[bytes, int, bytes]:
    """``(topic, sequence, payload)`` of one message; :class:`WireError` if malformed."""
    if len(frames) != 3:
        raise WireError(f"expected 3 frames (topic, sequence, payload), got {len(frames)}")
    topic, seq, payload = frames
    if len(seq) != 8:
        raise WireError(f"the sequence frame has {len(seq)} bytes, not 8")
    return bytes(topic), int.from_bytes(seq, "big", signed=True), payload


def pack_seq(seq: int) -> bytes:
    """A sequence number as its 8-byte big-endian frame (``END_SEQ`` included)."""
    return seq.to_bytes(8, "big", signed=True)


_ENCODER = msgspec.msgpack.Encoder()


def encode_batch(
    ts: float,
    events: Sequence[Event],
    encoding: Encoding = "map",
    data_parallel_rank: int | None = 0,
) -> bytes:
    """A payload in one of the three layouts (the simulated upstream publishes with it).
    ``array`` leaves out what older releases did not send (trailing fields at their
    default, the rank when ``None``)."""
    if encoding == "map":
        return _ENCODER.encode(_PosBatchMapEvents(ts, list(events), data_parallel_rank))
    if encoding == "map-batch":
        return _ENCODER.encode(_MapBatchMapEvents(ts, list(events), data_parallel_rank))
    if encoding == "array":
        batch: list[Any] = [ts, [_positional(e) for e in events]]
        if data_parallel_rank is not None:
            batch.append(data_parallel_rank)
        return _ENCODER.encode(batch)
    raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}, not {encoding!r}")


def _positional(event: Event) -> list[Any]:
    """An event as older releases sent it: the tag, then the fields in declaration order,
    trailing ``None`` fields left out (msgspec's ``array_like`` keeps them)."""
    values = [getattr(event, name) for name in event.__struct_fields__]
    while values and values[-1] is None:
        values.pop()
    return [event.__struct_config__.tag, *values]
