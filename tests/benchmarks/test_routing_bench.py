"""The routing benchmark (benchmarks/routing.py) runs every policy on one small trace in
each scenario (one gateway; several gateways each with its own estimate; a replica
restarted), answers every request, and says where each decision's cache knowledge came
from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import routing  # noqa: E402


def test_routing_benchmark_runs_the_policies_side_by_side_per_scenario() -> None:
    small = ["--groups", "2", "--users", "2", "--turns", "2", "--shared-tokens", "600"]
    out = subprocess.run(
        [sys.executable, str(BENCH / "routing.py"), *small, "--seeds", "1", "--arrival-rate",
         "20", "--think", "0", "--policies", "round_robin,prefix,precise,oracle",
         "--scenarios", "single,gateways-2", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )  # fmt: skip
    result = json.loads(out.stdout)
    assert [s["scenario"] for s in result["scenarios"]] == ["single", "gateways-2"]
    for sc in result["scenarios"]:
        runs = {r["policy"]: r for r in sc["runs"]}
        assert set(runs) == {"round_robin", "prefix", "precise", "oracle"}
        for r in runs.values():
            assert r["failed"] == 0 and 0 <= r["hit_rate"] <= 1 and r["ttft_p90_ms"] > 0
        assert runs["precise"]["route_sources"] == {"events": 8}
        assert runs["prefix"]["route_sources"] == {"estimate": 8}
        assert runs["round_robin"]["route_sources"] == {"-": 8}
        assert set(sc["goals"])
    assert "2 gateways" in result["scenarios"][1]["description"]
    (trace,) = result["traces"]
    assert trace["requests"] == 8 and 0 < trace["cold_miss_bound"] < 1
    assert result["decision_cost"]["precise_lookup_ms"] > 0


def test_a_restart_clears_the_replicas_cache_and_says_so_in_its_events() -> None:
    from prefixgate.events import AllBlocksCleared
    from prefixgate.lab.events.publisher import PublisherSettings

    events = PublisherSettings("tcp://127.0.0.1:*", None, "kv")
    settings = routing.SimSettings(block_size=routing.B, capacity_tokens=1024, kv_events=events)
    (up,) = routing._start_replicas(settings, [1024])
    published: list = []
    try:
        sim = up.app.state.sim
        sim.events.publish = lambda batch, ts=None: published.extend(batch)
        up.cache.process(list(range(64)))
        sim.publish_events()
        assert up.cache.pool.longest_prefix(routing.hash_blocks(list(range(64)), routing.B))
        assert routing.restart(up)
        assert up.cache.pool.longest_prefix(routing.hash_blocks(list(range(64)), routing.B)) == 0
        assert isinstance(published[-1], AllBlocksCleared)
    finally:
        up.stop()


def test_uneven_caches_keep_the_mean_and_differ() -> None:
    caps = routing._capacities(1600, 4, True)
    assert len(set(caps)) == 4 and min(caps) < 1600 < max(caps)
    assert routing._capacities(1600, 4, False) == [1600] * 4
