"""Request arrival times, as ``vllm bench serve`` draws them: at ``rate`` requests/s the
gaps follow a gamma distribution with shape ``burstiness`` and mean ``1 / rate``
(burstiness 1: exponential gaps, a Poisson process; < 1 burstier; > 1 more even). No rate
(or ``inf``): everything arrives at once and the concurrency limit paces the run."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["arrival_offsets"]


def arrival_offsets(
    n: int,
    rate: float | None,
    *,
    burstiness: float = 1.0,
    seed: int = 0,
) -> list[float]:
    """Seconds from the start of the run at which each of ``n`` requests arrives
    (seeded: the same schedule for every target)."""
    if burstiness <= 0:
        raise ValueError("burstiness must be positive")
    if rate is None or math.isinf(rate):
        return [0.0] * n
    if rate <= 0:
        raise ValueError("rate must be positive")
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    gaps[0] = 0.0  # the first request goes at once
    return [float(t) for t in np.cumsum(gaps)]
