"""Throughput of the prefix-cache model's hot path.

Prints tokens per second for ``hash_blocks`` at block sizes 16, 64 and 256, and for
``PrefixCache.process`` on a 100k-token prompt (cold: every block is new; warm: every
block hits). Each figure is the best of ``--repeat`` runs.

    .venv/bin/python benchmarks/cache_hashing.py [--tokens N] [--repeat R] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from collections.abc import Callable

from prefixgate.cache import PrefixCache, hash_blocks


def best_seconds(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def run(num_tokens: int, prompt_tokens: int, repeat: int) -> dict[str, float]:
    rng = random.Random(0)
    tokens = [rng.randrange(150_000) for _ in range(num_tokens)]
    results: dict[str, float] = {}
    for block_size in (16, 64, 256):
        secs = best_seconds(lambda bs=block_size: hash_blocks(tokens, bs), repeat)
        results[f"hash_blocks_b{block_size}_tokens_per_s"] = num_tokens / secs

    prompt = tokens[:prompt_tokens]

    def cold() -> None:
        PrefixCache(16).process(prompt)

    warm_cache = PrefixCache(16)
    warm_cache.process(prompt)
    cold_s = best_seconds(cold, repeat)
    warm_s = best_seconds(lambda: warm_cache.process(prompt), repeat)
    results["process_100k_cold_tokens_per_s"] = prompt_tokens / cold_s
    results["process_100k_warm_tokens_per_s"] = prompt_tokens / warm_s
    results["process_100k_cold_ms"] = cold_s * 1000
    results["process_100k_warm_ms"] = warm_s * 1000
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000, help="tokens for hash_blocks")
    parser.add_argument("--prompt", type=int, default=100_000, help="prompt length for process")
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure (best kept)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    results = run(args.tokens, args.prompt, args.repeat)
    if args.json:
        meta = {"python": platform.python_version(), "machine": platform.machine()}
        print(json.dumps({**meta, **results}, indent=2))
        return
    for name, value in results.items():
        unit = "ms" if name.endswith("_ms") else "tokens/s"
        label = name.removesuffix("_tokens_per_s")
        print(f"{label:<28} {value:>14,.1f} {unit}")


if __name__ == "__main__":
    main()
