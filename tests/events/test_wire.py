"""Decoding every payload layout the engines send, built here by hand with msgpack (not
with the encoder under test), and what happens to what does not fit."""

from __future__ import annotations

import msgspec
import pytest

from prefixgate.events import (
    ENCODINGS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    WireDecoder,
    WireError,
    encode_batch,
)
from prefixgate.events.wire import pack_seq, split_frames

pack = msgspec.msgpack.encode
TOKENS = list(range(3101, 3133))


def kind(event) -> str:
    """The public event type (positional events decode into private subclasses)."""
    return next(
        c for c in (BlockStored, BlockRemoved, AllBlocksCleared) if isinstance(event, c)
    ).__name__


# vLLM 0.32 as observed (docs: the issue): a positional batch of map events
VLLM_032 = [
    1796087710.27,
    [
        {
            "type": "BlockStored",
            "block_hashes": [18408515779274656208],
            "parent_block_hash": 16801480555812790781,
            "token_ids": TOKENS,
            "block_size": 32,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
            "extra_keys": [None],
            "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        }
    ],
    0,
]


def test_vllm_032_batch() -> None:
    batch = WireDecoder().decode(pack(VLLM_032))
    assert batch.layout == "map"
    assert batch.ts == pytest.approx(1796087710.27)
    assert batch.data_parallel_rank == 0
    (ev,) = batch.events
    assert isinstance(ev, BlockStored)
    assert ev.block_hashes == [18408515779274656208]  # u64 above 2**63 survives
    assert ev.parent_block_hash == 16801480555812790781
    assert ev.token_ids == TOKENS
    assert (ev.block_size, ev.medium, ev.group_idx, ev.extra_keys) == (32, "GPU", 0, [None])
    assert batch.unknown == batch.malformed == 0


def test_older_positional_events_of_every_length() -> None:
    """Events as arrays, the tag first; releases before ``medium`` sent five fields."""
    payload = pack(
        [
            12.5,
            [
                ["BlockStored", [1, 2], None, TOKENS * 2, 32, None],
                ["BlockStored", [3], 2, TOKENS, 32, None, "CPU"],
                ["BlockRemoved", [1]],
                ["BlockRemoved", [2], "GPU", 0],
                ["AllBlocksCleared"],
            ],
        ]
    )
    batch = WireDecoder().decode(payload)
    assert batch.layout == "array"
    assert batch.data_parallel_rank is None
    a, b, c, d, e = batch.events
    assert isinstance(a, BlockStored) and a.block_hashes == [1, 2] and a.medium is None
    assert isinstance(b, BlockStored) and b.parent_block_hash == 2 and b.medium == "CPU"
    assert isinstance(c, BlockRemoved) and c.block_hashes == [1] and c.medium is None
    assert isinstance(d, BlockRemoved) and d.medium == "GPU" and d.group_idx == 0
    assert isinstance(e, AllBlocksCleared)


def test_newer_fields_at_the_end_are_ignored() -> None:
    payload = pack(
        [1.0, [["BlockRemoved", [9], "GPU", 0, "a field of a later release"]], 0, "more"]
    )
    (ev,) = WireDecoder().decode(payload).events
    assert isinstance(ev, BlockRemoved) and ev.block_hashes == [9]


def test_map_batch_with_fields_left_out() -> None:
    payload = pack(
        {
            "ts": 3.0,
            "events": [
                {
                    "type": "BlockStored",
                    "block_hashes": [b"\x01" * 32],
                    "token_ids": TOKENS,
                    "block_size": 32,
                },
                {
                    "type": "BlockRemoved",
                    "block_hashes": [b"\x01" * 32],
                    "medium": "GPU",
                    "a_new_field": [1, 2],
                },
            ],
            "data_parallel_rank": 3,
        }
    )
    batch = WireDecoder().decode(payload)
    assert batch.layout == "map-batch"
    assert batch.data_parallel_rank == 3
    stored, removed = batch.events
    assert stored.block_hashes == [b"\x01" * 32]  # hashes as bytes, as some builds send
    assert stored.parent_block_hash is None and stored.medium is None
    assert removed.medium == "GPU"


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_publishers_encodings_decode_to_the_same_events(encoding) -> None:
    events = [
        BlockStored([5, 6], 4, TOKENS * 2, 32, None, "GPU", None, [None, None], 0, "full"),
        BlockRemoved([5], "GPU"),
        AllBlocksCleared(),
    ]
    payload = encode_batch(2.0, events, encoding)
    raw = msgspec.msgpack.decode(payload)
    first_event = raw["events"][0] if isinstance(raw, dict) else raw[1][0]
    shape = {"map": (list, dict), "array": (list, list), "map-batch": (dict, dict)}[encoding]
    assert (type(raw), type(first_event)) == shape
    batch = WireDecoder().decode(payload)
    assert batch.layout == encoding
    got = [(kind(e), msgspec.structs.asdict(e)) for e in batch.events]
    assert got == [(kind(e), msgspec.structs.asdict(e)) for e in events]


def test_one_decoder_follows_a_publisher_that_changes_layout() -> None:
    dec = WireDecoder()
    events = [BlockRemoved([1], "GPU")]
    for encoding in ("map", "array", "map-batch", "map", "array"):
        (ev,) = dec.decode(encode_batch(1.0, events, encoding)).events
        assert isinstance(ev, BlockRemoved) and ev.block_hashes == [1]


def test_unknown_and_malformed_events_cost_only_themselves() -> None:
    payload = pack(
        [
            1.0,
            [
                {"type": "BlockStored", "block_hashes": [1], "token_ids": [1, 2], "block_size": 2},
                {"type": "BlockPinned", "block_hashes": [1]},
                ["BlockMigrated", [1], "GPU"],
                ["BlockRemoved", [1]],
                {"type": "BlockRemoved", "block_hashes": "not a list"},
                ["BlockStored"],
                17,
                {"no": "type"},
            ],
            0,
        ]
    )
    batch = WireDecoder().decode(payload)
    assert [kind(e) for e in batch.events] == ["BlockStored", "BlockRemoved"]
    assert batch.unknown == 2
    assert batch.unknown_types == ("BlockPinned", "BlockMigrated")
    assert batch.malformed == 4


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # never used in msgpack
        pack("a string"),
        pack({"ts": 1.0}),  # no events
        pack([1.0]),
        pack(["not a time", []]),
        pack([1.0, [{"type": "BlockRemoved", "block_hashes": [1]}], 0])[:-3],  # truncated
    ],
)
def test_payloads_that_are_no_batch(payload) -> None:
    with pytest.raises(WireError):
        WireDecoder().decode(payload)


def test_frames() -> None:
    assert split_frames([b"kv", pack_seq(7), b"x"]) == (b"kv", 7, b"x")
    assert split_frames([b"", (2**40).to_bytes(8, "big"), b""])[1] == 2**40
    assert pack_seq(-1) == b"\xff" * 8
    for frames in ([b"kv", pack_seq(1)], [b"kv", b"\x00" * 7, b"x"], [b"a", b"b", b"c", b"d"]):
        with pytest.raises(WireError):
            split_frames(frames)


def test_public_surface() -> None:
    """Every name of the package resolves (they are imported on first use)."""
    import prefixgate.events as events

    assert sorted(events.__all__) == sorted(events._WHERE)
    for name in events.__all__:
        assert getattr(events, name) is not None, name
    with pytest.raises(AttributeError):
        events.NoSuchName  # noqa: B018
