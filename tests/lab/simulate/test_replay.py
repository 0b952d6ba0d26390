"""The replay engine: untimed and timed runs, sweeps, and the aggregates."""

from __future__ import annotations

import pytest

from prefixgate.lab.simulate import RunConfig, TraceRequest, parse_capacity, run_simulation
from prefixgate.lab.simulate.replay import IdCache, replay


def _reqs() -> list[TraceRequest]:
    return [
        TraceRequest(["a", "b"], 8, output_tokens=100, arrival=0.0),
        TraceRequest(["c", "d"], 8, output_tokens=1, arrival=1.0),
        TraceRequest(["a", "b"], 8, output_tokens=1, arrival=2.0),
    ]


def test_untimed_requests_free_their_blocks_at_once():
    run = replay(_reqs(), RunConfig(4, gpu_capacity_tokens=8))
    # the second request evicts a and b, so the third misses
    assert [r.gpu_hit_tokens for r in run.rows] == [0, 0, 0]
    assert run.stats.incomplete_requests == 0


def test_timed_requests_hold_their_blocks_while_running():
    config = RunConfig(4, gpu_capacity_tokens=8, timed=True, decode_rate=1.0)
    run = replay(_reqs(), config)
    # the first request runs until t=100: the second does not fit, the third hits a (b
    # is beyond the last-token cap and would need a block of its own: it does not fit)
    assert [r.gpu_hit_tokens for r in run.rows] == [0, 0, 4]
    assert run.stats.incomplete_requests == 2


def test_timed_needs_arrivals():
    with pytest.raises(ValueError):
        run_simulation([TraceRequest(["a"], 4)], block_size=4, timed=True)


def test_aggregates_and_prefill_seconds():
    reqs = [TraceRequest(["a", "b", "c"], 16), TraceRequest(["a", "b", "c"], 16)]
    st = run_simulation(reqs, block_size=4, prefill_rate=4.0).main.stats
    assert (st.prompt_tokens, st.gpu_hit_tokens, st.computed_tokens) == (32, 12, 20)
    assert st.token_hit_rate == pytest.approx(12 / 32)
    assert st.block_hit_rates(4) == (pytest.approx(3 / 8), 0.0, pytest.approx(3 / 8))
    assert st.prefill_seconds == pytest.approx(5.0)
    assert st.prefill_seconds_saved == pytest.approx(3.0)
    assert st.mean_request_token_hit_rate == pytest.approx(0.375)
    assert st.id_hit_ratio is None  # no trace ids


def test_sweep_runs_one_replay_per_capacity():
    reqs = [TraceRequest([f"s{i}", "x"], 8) for i in range(3)] * 2
    result = run_simulation(reqs, block_size=4, sweep=["4", "8", "unlimited"])
    assert result.sweep
    assert [r.label for r in result.runs] == ["4", "8", "unlimited"]
    assert [r.config.gpu_capacity_tokens for r in result.runs] == [4, 8, None]
    hits = [r.stats.gpu_hit_tokens for r in result.runs]
    assert hits == sorted(hits) and hits[-1] == 12


def test_parse_capacity():
    assert parse_capacity("2M") == 2 * 1024 * 1024
    assert parse_capacity("64k") == 65536
    assert parse_capacity("1,000") == 1000
    assert parse_capacity("unlimited") == float("inf")
    assert parse_capacity(None) is None
    for bad in ("x", "-1"):
        with pytest.raises(ValueError):
            parse_capacity(bad)


def test_id_cache_lru():
    ids = IdCache(2)
    assert ids.process([1, 2]) == 0
    assert ids.process([1, 2]) == 2
    assert ids.process([3]) == 0  # evicts 1
    assert ids.process([1, 2]) == 0
    unlimited = IdCache()
    unlimited.process([1, 2, 3])
    assert unlimited.process([1, 2, 4]) == 2


def test_host_tier_in_run_simulation():
    reqs = [TraceRequest(["a", "b"], 8), TraceRequest(["c", "d"], 8), TraceRequest(["a", "b"], 8)]
    result = run_simulation(
        reqs,
        block_size=4,
        gpu_capacity_tokens=8,
        host_capacity_tokens="unlimited",
        bytes_per_block=10,
    )
    st = result.main.stats
    assert result.main.config.host
    assert (st.gpu_hit_tokens, st.host_hit_tokens) == (0, 4)
    assert (st.host_stores, st.host_loads) == (4, 1)
    assert (st.host_store_bytes, st.host_load_bytes) == (40, 10)
    assert st.external_hit_rate == pytest.approx(4 / 24)
