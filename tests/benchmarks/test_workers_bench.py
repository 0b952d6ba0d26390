"""The search of ``workers.py --streams``: the largest level a worker count passes, found
from a first guess by steps then bisection, within its budget of levels."""

from __future__ import annotations

import asyncio
import sys
from argparse import Namespace
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import workers_streams as ws  # noqa: E402


class FakeRunner:
    """Levels pass up to ``capacity`` streams; the levels asked for, in order."""

    def __init__(self, capacity: int, **kw) -> None:
        self.capacity = capacity
        self.args = Namespace(start=100, steps=6, max_levels=7, max_n=6000, bound_ms=10.0, **kw)
        self.asked: list[int] = []

    async def level(self, workers: int, n: int) -> dict:
        self.asked.append(n)
        ok = n <= self.capacity
        return {"n": n, "completed": n, "stalled": 0, "added_gap_p99_ms": 1.0 if ok else 50.0}


def search(runner: FakeRunner, k: int, step: int) -> int | None:
    found = asyncio.run(ws.Search(runner, 1).run(k, step))
    return None if found is None else ws.n_at(runner.args, found)


def test_up_by_doublings_then_bisection_to_the_grid_point_below_the_capacity():
    runner = FakeRunner(330)
    assert search(runner, 0, 6) == 317  # 100 · 2^(10/6), the last grid point ≤ 330
    assert runner.asked == [100, 200, 400, 283, 317, 356]


def test_down_when_the_first_guess_fails():
    runner = FakeRunner(60)
    assert search(runner, 0, 6) == 56
    assert runner.asked == [100, 50, 71, 56, 63]


def test_the_budget_bounds_the_levels_and_nothing_passing_is_none():
    runner = FakeRunner(3)
    assert search(runner, 0, 6) is None
    assert len(runner.asked) == 4 and min(runner.asked) >= 10  # 100, 50, 25, 13
    runner = FakeRunner(10**6)
    assert search(runner, 0, 6) == 6400 // 2 and runner.asked[-1] == 3200
