"""The routing benchmark (benchmarks/routing.py) runs every policy on one small trace,
answers every request, and says where each decision's cache knowledge came from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_routing_benchmark_runs_the_policies_side_by_side() -> None:
    small = ["--groups", "2", "--users", "2", "--turns", "2", "--shared-tokens", "600"]
    out = subprocess.run(
        [sys.executable, str(BENCH / "routing.py"), *small, "--seeds", "1", "--arrival-rate",
         "20", "--think", "0", "--policies", "round_robin,prefix,precise,oracle", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )  # fmt: skip
    result = json.loads(out.stdout)
    runs = {r["policy"]: r for r in result["runs"]}
    assert set(runs) == {"round_robin", "prefix", "precise", "oracle"}
    for r in runs.values():
        assert r["failed"] == 0 and 0 <= r["hit_rate"] <= 1 and r["ttft_p90_ms"] > 0
    assert runs["precise"]["route_sources"] == {"events": 8}
    assert runs["prefix"]["route_sources"] == {"estimate": 8}
    assert runs["round_robin"]["route_sources"] == {"-": 8}
    (trace,) = result["traces"]
    assert trace["requests"] == 8 and 0 < trace["cold_miss_bound"] < 1
    assert set(result["goals"]) and result["decision_cost"]["precise_lookup_ms"] > 0
