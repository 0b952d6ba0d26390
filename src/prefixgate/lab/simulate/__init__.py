"""``prefixgate simulate``: what-if replay through a GPU and a host-memory KV tier.

The pipeline, in order::

    input (Mooncake JSONL | store records | synthetic agents)   traces.py
      -> block keys per request                                  traces.py
      -> replay through GPU (+ host) tiers, hybrid KV groups      engine.py, cache/tiers.py
      -> aggregates per run (one run, a sweep, or a scenario)     engine.py
      -> text table | JSON | PNG                                 report.py

:func:`run_simulation` is what the CLI calls; :func:`run_scenario` runs a ready scenario.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from prefixgate.cache.groups import KVGroup, Policy, parse_groups
from prefixgate.cache.tiers import Offload

from .replay import Run, RunConfig, Stats, replay
from .results import SimulationResult, format_tokens, plot_sweep, render_text, to_json
from .scenarios import SCENARIOS, run_scenario
from .traces import (
    MOONCAKE_BLOCK_SIZE,
    Trace,
    TraceRequest,
    load_mooncake,
    load_store,
    load_synthetic,
)

__all__ = [
    "SCENARIOS",
    "UNLIMITED",
    "Run",
    "RunConfig",
    "SimulationResult",
    "Stats",
    "Trace",
    "TraceRequest",
    "load_source",
    "parse_capacity",
    "plot_sweep",
    "render_text",
    "run_scenario",
    "run_simulation",
    "to_json",
]

UNLIMITED = math.inf
Capacity = int | float | str | None
ProgressFn = Callable[[str, int, int | None], None]
_DEFAULT_BLOCK_SIZE = 64
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_capacity(text: str | int | float | None) -> int | float | None:
    """``"2M"`` → 2,097,152 tokens (K/M/G are binary); ``"unlimited"``/``"inf"`` →
    :data:`UNLIMITED`; ``None`` stays ``None``."""
    if text is None or isinstance(text, int | float):
        return text
    t = text.strip().lower().replace("_", "").replace(",", "")
    if t in ("unlimited", "inf", "infinite", "none"):
        return UNLIMITED
    mult = 1
    if t and t[-1] in _UNITS:
        mult, t = _UNITS[t[-1]], t[:-1]
    try:
        value = float(t) * mult
    except ValueError:
        raise ValueError(
            f"bad capacity {text!r} (want tokens, e.g. 65536, 2M or unlimited)"
        ) from None
    if value < 0:
        raise ValueError(f"capacity must be >= 0, not {text!r}")
    return int(value)


def _is_store(source: str) -> bool:
    return source.startswith(("sqlite:", "postgresql://", "postgres://")) or source.endswith(
        (".db", ".sqlite", ".sqlite3")
    )


def load_source(
    source: Any,
    block_size: int | None = None,
    *,
    progress: ProgressFn | None = None,
) -> Trace:
    """An input for the replay: a ``.jsonl`` Mooncake trace path, a store DSN,
    ``"synthetic"`` (or ``"synthetic:SESSIONSxTURNS"``), a ``TrafficSpec``, a
    :class:`Trace` or a list of :class:`TraceRequest`."""
    cb = None if progress is None else (lambda d, t: progress("load", d, t))
    if isinstance(source, Trace):
        return source
    if isinstance(source, list):
        return Trace("requests", "requests", block_size or _DEFAULT_BLOCK_SIZE, list(source))
    if isinstance(source, Path):
        source = str(source)
    if isinstance(source, str):
        if source == "synthetic" or source.startswith("synthetic:"):
            from prefixgate.lab.traffic import TrafficSpec

            spec = TrafficSpec()
            if ":" in source:
                sessions, _, turns = source.split(":", 1)[1].partition("x")
                spec = TrafficSpec(sessions=int(sessions), turns=int(turns or spec.turns))
            return load_synthetic(spec, block_size or _DEFAULT_BLOCK_SIZE, progress=cb)
        if _is_store(source):
            return load_store(source, block_size, progress=cb, default=_DEFAULT_BLOCK_SIZE)
        if source.endswith((".jsonl", ".json")) or Path(source).is_file():
            return load_mooncake(source, block_size or MOONCAKE_BLOCK_SIZE, progress=cb)
        raise ValueError(
            f"unknown input {source!r} (want a .jsonl trace, a store DSN or 'synthetic')"
        )
    from prefixgate.lab.traffic import TrafficSpec

    if isinstance(source, TrafficSpec):
        return load_synthetic(source, block_size or _DEFAULT_BLOCK_SIZE, progress=cb)
    raise TypeError(f"cannot replay a {type(source).__name__}")


def _gpu_cap(value: Capacity) -> int | None:
    cap = parse_capacity(value)
    return None if cap is None or cap == UNLIMITED else int(cap)


def run_simulation(
    source: Any,
    *,
    block_size: int | None = None,
    gpu_capacity_tokens: Capacity = None,
    host_capacity_tokens: Capacity = None,
    groups: str | Sequence[KVGroup] = "full",
    policy: Policy = "veto",
    timed: bool = False,
    prefill_rate: float | None = None,
    sweep: Sequence[Capacity] | None = None,
    progress: ProgressFn | None = None,
    decode_rate: float = 50.0,
    offload: Offload = "through",
    bytes_per_block: int | None = None,
    keep_rows: bool = True,
) -> SimulationResult:
    """Replay ``source`` (see :func:`load_source`) and return the result.

    ``gpu_capacity_tokens``: ``None``/``"unlimited"`` for an unlimited GPU tier.
    ``host_capacity_tokens``: ``None`` for no host tier, ``"unlimited"`` or a number of
    tokens for one. ``sweep``: GPU capacities to replay one after another (the GPU
    capacity argument is then ignored). ``progress(phase, done, total)`` is called now and
    then.
    """
    trace = load_source(source, block_size, progress=progress)
    bs = trace.block_size
    kv_groups = parse_groups(groups) if isinstance(groups, str) else tuple(groups)
    host_cap = parse_capacity(host_capacity_tokens)
    base = RunConfig(
        block_size=bs,
        gpu_capacity_tokens=_gpu_cap(gpu_capacity_tokens),
        host_capacity_tokens=None if host_cap is None or host_cap == UNLIMITED else int(host_cap),
        host=host_cap is not None,
        groups=kv_groups,
        policy=policy,
        offload=offload,
        timed=timed,
        prefill_rate=prefill_rate,
        decode_rate=decode_rate,
        bytes_per_block=bytes_per_block,
        id_block_size=trace.id_block_size,
    )
    if timed and any(r.arrival is None for r in trace.requests):
        raise ValueError("timed replay needs arrival times")
    caps = [base.gpu_capacity_tokens] if sweep is None else [_gpu_cap(c) for c in sweep]
    runs: list[Run] = []
    for n, cap in enumerate(caps, 1):
        config = replace(base, gpu_capacity_tokens=cap)
        label = "result" if sweep is None else format_tokens(cap)
        phase = "replay" if sweep is None else f"sweep {n}/{len(caps)}"
        cb = None if progress is None else (lambda d, t, ph=phase: progress(ph, d, t))
        runs.append(replay(trace.requests, config, label=label, keep_rows=keep_rows, progress=cb))
    result = SimulationResult(
        {
            "kind": trace.kind,
            "name": trace.name,
            "requests": len(trace.requests),
            "skipped": trace.skipped,
            "block_size": bs,
            **({"block_size_source": trace.block_source} if trace.block_source else {}),
            **({"measured": trace.measured} if trace.measured else {}),
        },
        runs,
        sweep=sweep is not None,
    )
    if trace.measured is not None:
        m = trace.measured
        result.notes.append(
            f"Measured on the upstream for the same {len(trace.requests):,} served requests: "
            f"hit rate {m['hit_rate']:.1%} ({m['cached_tokens']:,} of {m['prompt_tokens']:,} "
            f"prompt tokens); the replay's is in the table (block size {bs}, "
            f"{trace.block_source})."
        )
    if trace.kind == "mooncake" and bs == MOONCAKE_BLOCK_SIZE:
        result.notes.append(
            "Block hit ratio over ids as given: every id one 512-token block (partial last "
            "block included), hit = longest prefix of ids seen before. Token hit rate under "
            "vLLM's rules: partial last block never a hit, at most floor((L-1)/512)*512 tokens."
        )
    return result
