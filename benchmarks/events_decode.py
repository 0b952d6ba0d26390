"""Speed of reading engine KV-cache events: decoding, and decoding into the index.

    .venv/bin/python benchmarks/events_decode.py [--block-size 16] [--batches 200] [--json]

Payloads are built as engines send them (``events.encode_batch``: vLLM 0.32's ``map``,
older ``array``, newer ``map-batch``), in three shapes of traffic:

- ``prefill``: each batch one ``BlockStored`` of 64 blocks (a long prompt's new blocks);
- ``decode``: each batch 16 ``BlockStored`` of one block (output filling blocks);
- ``churn``: each batch a ``BlockRemoved`` of 16 blocks and a ``BlockStored`` of 16.

``decode`` figures are blocks per second through ``WireDecoder.decode`` (every block named
by an event counts; a stored block carries ``block_size`` token ids, the bulk of the work).
``generic`` decodes the same payloads into plain dicts and lists with msgpack and no types,
the floor a typed decoder can be set against: ``ratio`` is typed / generic (> 1: the typed
decode is faster than building untyped objects). ``index`` is decode + ``EventIndex.apply``
(content keys hashed, entries stored or removed). Each figure is the best of ``--repeat``
runs; on a shared machine the ratios are the figures to compare. Goal: decode ≥ 1M blocks/s.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path

import msgspec

from prefixgate.events import (
    ENCODINGS,
    BlockRemoved,
    BlockStored,
    EventIndex,
    WireDecoder,
    encode_batch,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cache_hashing import best_seconds  # noqa: E402

SHAPES = ("prefill", "decode", "churn")


def payloads(shape: str, encoding: str, batches: int, block_size: int) -> tuple[list, int]:
    """``batches`` payloads of one shape, and the number of blocks they name."""
    rng = random.Random(hash((shape, encoding)) & 0xFFFF)
    next_hash, parent, held = 1, None, []
    out, blocks = [], 0

    def stored(n: int) -> BlockStored:
        nonlocal next_hash, parent
        hashes = list(range(next_hash, next_hash + n))
        next_hash += n
        tokens = [rng.randrange(150_000) for _ in range(n * block_size)]
        ev = BlockStored(hashes, parent, tokens, block_size, None, "GPU", None, [None] * n, 0)
        parent = hashes[-1]
        held.extend(hashes)
        return ev

    for _ in range(batches):
        if shape == "prefill":
            parent = None
            events: list = [stored(64)]
        elif shape == "decode":
            events = [stored(1) for _ in range(16)]
        else:
            gone = held[:16]
            del held[:16]
            events = [BlockRemoved(gone, "GPU"), stored(16)] if gone else [stored(16)]
        blocks += sum(len(e.block_hashes) for e in events)
        out.append(encode_batch(time.time(), events, encoding))  # type: ignore[arg-type]
    return out, blocks


def run(batches: int, block_size: int, repeat: int) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    generic = msgspec.msgpack.Decoder()
    for shape in SHAPES:
        for encoding in ENCODINGS:
            data, blocks = payloads(shape, encoding, batches, block_size)
            decoder = WireDecoder()
            assert all(decoder.decode(p).events for p in data)  # every payload decodes

            def typed(data=data, decoder=decoder) -> None:
                for p in data:
                    decoder.decode(p)

            def untyped(data=data) -> None:
                for p in data:
                    generic.decode(p)

            def indexed(data=data, decoder=decoder, blocks=blocks) -> None:
                index = EventIndex(max_blocks=10 * blocks)
                for p in data:
                    index.apply("r", decoder.decode(p).events)

            t_typed = best_seconds(typed, repeat)
            t_generic = best_seconds(untyped, repeat)
            t_index = best_seconds(indexed, repeat)
            results[f"{shape}/{encoding}"] = {
                "decode_blocks_per_s": blocks / t_typed,
                "generic_blocks_per_s": blocks / t_generic,
                "ratio": t_generic / t_typed,
                "index_blocks_per_s": blocks / t_index,
            }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200, help="payloads per shape")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block")
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure (best kept)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    results = run(args.batches, args.block_size, args.repeat)
    if args.json:
        report = {"python": platform.python_version(), "block_size": args.block_size}
        report["figures"] = results
        print(json.dumps(report, indent=2))
        return
    print(f"block size {args.block_size}; blocks per second (best of {args.repeat})")
    print(f"{'shape/encoding':<20} {'decode':>12} {'generic':>12} {'ratio':>6} {'index':>12}")
    for name, f in results.items():
        print(
            f"{name:<20} {f['decode_blocks_per_s']:>12,.0f} {f['generic_blocks_per_s']:>12,.0f}"
            f" {f['ratio']:>6.2f} {f['index_blocks_per_s']:>12,.0f}"
        )


if __name__ == "__main__":
    main()
