"""Ready scenarios: one input, several configurations side by side.

``seed-l2`` is the DeepSeek deployment's second incident: a host-memory (L2) KV tier that was written
198,422 times and read 0 times, behind a hybrid model (MLA full attention + sliding window
+ MTP draft group). Byte-stable agent sessions, many of them at once, so the GPU tier is
too small for the working set; a big host tier. Under ``veto`` the host is written all the
time and never read; under ``promote`` it serves the evicted prefixes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from prefixgate.cache.groups import KVGroup, Policy, parse_groups

from .replay import RunConfig, replay
from .results import SimulationResult, format_tokens
from .traces import Trace, load_synthetic

__all__ = ["SCENARIOS", "Scenario", "run_scenario"]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    load: Callable[[int], Trace]  # block size -> input
    block_size: int
    gpu_capacity_tokens: int | None
    host_capacity_tokens: int | None
    groups: tuple[KVGroup, ...]
    policies: tuple[Policy, ...] = ("veto", "promote")
    prefill_rate: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


def _seed_l2_traffic(block_size: int) -> Trace:
    from prefixgate.lab.traffic import AGENT_STABLE_OPENAI, TrafficSpec

    spec = TrafficSpec(
        sessions=48,
        turns=12,
        concurrency=24,
        seed=1,
        mix={AGENT_STABLE_OPENAI: 1.0},
        titles=False,
    )
    return load_synthetic(spec, block_size)


SEED_L2 = Scenario(
    name="seed-l2",
    description="host-memory L2 tier behind a hybrid model: veto vs promote",
    load=_seed_l2_traffic,
    block_size=64,
    gpu_capacity_tokens=96 * 1024,
    host_capacity_tokens=4 * 1024 * 1024,
    groups=parse_groups("full,window:128,draft:1"),
    prefill_rate=10_000.0,
    notes=(
        "48 byte-stable agent sessions x 12 turns, 24 open at once; DeepSeek-like groups:",
        "MLA full attention, a 128-token sliding window, an MTP draft group whose trailing",
        "block is never offloaded. Prefill rate 10,000 tokens/s (an assumption).",
    ),
)

SCENARIOS: dict[str, Scenario] = {SEED_L2.name: SEED_L2}


def run_scenario(
    name: str, *, progress: Callable[[str, int, int | None], None] | None = None
) -> SimulationResult:
    """Run every policy of the scenario on the same input and compare them."""
    try:
        sc = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})") from None
    trace = sc.load(sc.block_size)
    base = RunConfig(
        block_size=sc.block_size,
        gpu_capacity_tokens=sc.gpu_capacity_tokens,
        host_capacity_tokens=sc.host_capacity_tokens,
        host=True,
        groups=sc.groups,
        prefill_rate=sc.prefill_rate,
    )
    runs = []
    for policy in sc.policies:
        cb = None if progress is None else (lambda d, t, p=policy: progress(p, d, t))
        runs.append(replay(trace.requests, replace(base, policy=policy), label=policy, progress=cb))
    notes = list(sc.notes)
    by = {r.label: r.stats for r in runs}
    if "veto" in by and "promote" in by:
        v, p = by["veto"], by["promote"]
        notes.append(
            f"veto: host written {v.host_stores:,} blocks, read {v.host_loads:,}; "
            f"External hit rate {100 * v.external_hit_rate:.1f}%."
        )
        saved = v.computed_tokens - p.computed_tokens
        gain = f"promote: {saved:,} fewer prefill tokens ({100 * p.token_hit_rate - 100 * v.token_hit_rate:+.1f} pts hit rate"
        if sc.prefill_rate:
            gain += f", {saved / sc.prefill_rate:,.1f} prefill seconds saved"
        notes.append(gain + f"), after recomputing {p.recompute_tokens:,} tokens.")
    notes.append(
        f"GPU {format_tokens(sc.gpu_capacity_tokens)} tokens, host "
        f"{format_tokens(sc.host_capacity_tokens)} tokens, block size {sc.block_size}."
    )
    source = {
        "kind": trace.kind,
        "name": trace.name,
        "requests": len(trace.requests),
        "skipped": trace.skipped,
        "block_size": sc.block_size,
    }
    return SimulationResult(source, runs, scenario=sc.name, description=sc.description, notes=notes)
