"""Replica routing policies against simulated vLLM replicas with small caches.

Four simulated replicas (``start_upstreams_in_thread``), each with a prefix cache a
quarter of the traffic's working set, behind one gateway channel listing all four; 64
synthetic agent sessions (half Claude-Code-like on ``/v1/messages``, half opencode-like on
``/v1/chat/completions``) run concurrently, each sending its turns one after another. For
each policy: the hit rate (Σ cached / Σ prompt tokens, from the upstream usage), the mean
and p90 TTFT the gateway recorded, the share of requests of the busiest replica, and the
in-flight spread (max − min, sampled every 20 ms) against the ``prefix`` thresholds. The
ideal is ONE replica whose cache is four times as large (the whole working set).

The working set is measured, not guessed: the ideal runs first with an unbounded cache,
and the number of blocks it holds at the end is the working set (a cache of exactly that
size behaves identically: it never evicts). Each run starts cold replicas.

Sized for about 2 minutes on a 2-core machine: 12 turns a session (768 requests), 16 KB
of Claude Code tools and 8 KB of opencode tools, prefill 5,000 tokens/s (everything runs
in one process, so a faster prefill would leave TTFT measuring CPU queueing), and the
``prefix`` policy's absolute imbalance threshold scaled to this concurrency (8;
``prefix-defaults`` runs SGLang's 64 for comparison).

Also measured: the cost of the ``prefix`` policy's estimate for one 100k-token request
(render + tokenize + hash once, then match against four replicas' LRUs).

    .venv/bin/python benchmarks/routing.py [--sessions 64] [--turns 12] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time

import httpx

from prefixgate.config import parse_config
from prefixgate.routing import BlockLRU, imbalanced, prompt_blocks
from prefixgate.routing.policies import Balance
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.traffic import AGENT_CLAUDE_CODE, AGENT_STABLE_OPENAI, TrafficSpec, generate
from prefixgate.upstream_sim import SimSettings, start_upstreams_in_thread


class _Records:
    def __init__(self) -> None:
        self.records = []

    def submit(self, record) -> None:
        self.records.append(record)


def _traffic(args) -> list[list]:
    spec = TrafficSpec(
        sessions=args.sessions,
        turns=args.turns,
        seed=args.seed,
        tools_kb=16.0,
        stable_tools_kb=8.0,
        titles=False,
        compact_chars=0,
        max_tokens=64,
        mix={AGENT_CLAUDE_CODE: 0.5, AGENT_STABLE_OPENAI: 0.5},
    )
    return generate(spec)


async def _drive(url: str, sessions: list[list]) -> int:
    failures = 0

    async def one(client: httpx.AsyncClient, reqs: list) -> None:
        nonlocal failures
        for r in reqs:
            try:
                async with client.stream(
                    "POST", url + r.endpoint, headers=r.headers, content=r.content()
                ) as resp:
                    async for _ in resp.aiter_raw():
                        pass
                    if resp.status_code != 200:
                        failures += 1
            except httpx.TransportError as exc:  # counted, and the session goes on
                print(f"client: {type(exc).__name__} on {r.session_id} turn {r.turn}")
                failures += 1

    # Idle connections expire before uvicorn's 5 s keep-alive closes them under us.
    limits = httpx.Limits(max_connections=len(sessions) + 8, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=600, limits=limits, trust_env=False) as client:
        await asyncio.gather(*(one(client, s) for s in sessions))
    return failures


def run(policy: str, sessions: list[list], args, *, replicas: int, capacity: int | None) -> dict:
    settings = SimSettings(
        capacity_tokens=capacity,
        prefill_tokens_per_s=args.prefill_rate,
        decode_tokens_per_s=args.decode_rate,
    )
    ups = start_upstreams_in_thread(settings, replicas=replicas)
    balance = Balance(0.3, args.balance_abs, args.balance_rel)
    if policy == "prefix-defaults":
        balance = Balance()
    channel = {
        "name": "sim",
        "base_url": ups[0].base_url,
        "replicas": [u.base_url for u in ups[1:]],
        "routing": "prefix" if policy.startswith("prefix") or policy == "ideal" else policy,
        "routing_match_threshold": balance.match_threshold,
        "routing_balance_abs": balance.abs,
        "routing_balance_rel": balance.rel,
        "routing_lru_blocks": (capacity // 16) if capacity else 65536,
    }
    config = parse_config({"channels": [channel], "store": None})
    rec = _Records()
    app = create_app(config, recorder=rec)
    router = app.state.gateway.router
    gw = ServerThread(app).start()
    urls = [u.base_url for u in ups]
    spreads: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            loads = [router.inflight(u) for u in urls]
            spreads.append(max(loads) - min(loads))
            over.append(imbalanced(loads, balance))

    over: list[bool] = []
    sampler = threading.Thread(target=sample, daemon=True)
    t0 = time.perf_counter()
    sampler.start()
    try:
        failures = asyncio.run(_drive(gw.url, sessions))
    finally:
        stop.set()
        sampler.join()
        wall = time.perf_counter() - t0
        gw.stop()
        cached_blocks = sum(u.cache.pool.num_cached_blocks for u in ups)
        for u in ups:
            u.stop()
    ok = [r for r in rec.records if r.status == 200]
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    ttfts = sorted(r.ttft_ms for r in ok if r.ttft_ms is not None)
    per_replica = [sum(1 for r in ok if r.replica == u) for u in urls]
    return {
        "policy": policy,
        "replicas": replicas,
        "capacity_tokens": capacity,
        "requests": len(rec.records),
        "failed": failures + len(rec.records) - len(ok),
        "hit_rate": cached / prompt if prompt else 0.0,
        "ttft_mean_ms": statistics.fmean(ttfts) if ttfts else 0.0,
        "ttft_p90_ms": ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else 0.0,
        "busiest_share": max(per_replica) / max(1, len(ok)),
        "inflight_spread_max": max(spreads, default=0),
        "imbalanced_samples": (sum(over) / len(over)) if over else 0.0,
        "wall_s": wall,
        "cached_blocks_end": cached_blocks,
    }


def prefix_cost(tokens: int = 100_000, replicas: int = 4, repeat: int = 5) -> dict:
    """Seconds to estimate one ``tokens``-token request (hash once, match 4 LRUs)."""
    chunk = "def handler(request): return respond(request.body, status=200)  # line\n"
    text = (chunk * (tokens * 4 // len(chunk) + 1))[: tokens * 4]
    request = {"messages": [{"role": "system", "content": "You are a coding agent."},
                            {"role": "user", "content": text}]}  # fmt: skip
    lrus = [BlockLRU(65536) for _ in range(replicas)]
    lrus[0].add(prompt_blocks(request).hashes)
    best_hash = best_match = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        blocks = prompt_blocks(request)
        t1 = time.perf_counter()
        for lru in lrus:
            lru.match(blocks.hashes)
        t2 = time.perf_counter()
        best_hash, best_match = min(best_hash, t1 - t), min(best_match, t2 - t1)
    return {
        "tokens": tokens,
        "blocks": len(blocks),
        "render_hash_ms": best_hash * 1000,
        "match_4_replicas_ms": best_match * 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--prefill-rate", type=float, default=5_000.0)
    ap.add_argument("--decode-rate", type=float, default=20_000.0)
    ap.add_argument("--balance-abs", type=int, default=8, help="prefix: absolute imbalance")
    ap.add_argument("--balance-rel", type=float, default=1.5, help="prefix: relative imbalance")
    ap.add_argument("--policies", default="round_robin,least_busy,session,prefix,prefix-defaults")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()

    sessions = _traffic(args)
    ideal = run("ideal", sessions, args, replicas=1, capacity=None)
    working_set = ideal["cached_blocks_end"] * 16
    ideal["capacity_tokens"] = working_set
    per_replica = working_set // args.replicas
    rows = [ideal]
    for policy in args.policies.split(","):
        rows.append(run(policy, sessions, args, replicas=args.replicas, capacity=per_replica))
    for r in rows:
        r["vs_ideal"] = r["hit_rate"] / ideal["hit_rate"] if ideal["hit_rate"] else 0.0
    result = {
        "sessions": args.sessions,
        "turns": args.turns,
        "requests": sum(len(s) for s in sessions),
        "working_set_tokens": working_set,
        "capacity_per_replica": per_replica,
        "prefix_thresholds": {"match": 0.3, "abs": args.balance_abs, "rel": args.balance_rel},
        "runs": rows,
        "prefix_cost": prefix_cost(),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{args.sessions} sessions x {args.turns} turns = {result['requests']} requests; "
        f"working set {working_set:,} tokens; {args.replicas} replicas x {per_replica:,} tokens; "
        f"prefix thresholds match 0.3, abs {args.balance_abs}, rel {args.balance_rel}"
    )
    head = f"{'policy':<16}{'hit rate':>9}{'vs ideal':>9}{'TTFT ms':>9}{'p90 ms':>8}"
    head += f"{'busiest':>9}{'spread':>8}{'imbal.':>8}{'failed':>7}{'wall s':>8}"
    print(head)
    for r in rows:
        name = "ideal (1x4 cap)" if r["policy"] == "ideal" else r["policy"]
        print(
            f"{name:<16}{r['hit_rate']:>9.1%}{r['vs_ideal']:>9.1%}{r['ttft_mean_ms']:>9.0f}"
            f"{r['ttft_p90_ms']:>8.0f}{r['busiest_share']:>9.1%}{r['inflight_spread_max']:>8}"
            f"{r['imbalanced_samples']:>8.1%}{r['failed']:>7}{r['wall_s']:>8.1f}"
        )
    c = result["prefix_cost"]
    print(
        f"prefix estimate of a {c['tokens']:,}-token request ({c['blocks']} blocks): "
        f"render+hash {c['render_hash_ms']:.1f} ms, match 4 replicas {c['match_4_replicas_ms']:.2f} ms"
    )


if __name__ == "__main__":
    main()
