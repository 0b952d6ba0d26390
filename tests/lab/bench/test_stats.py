"""Metric formulas on hand-made timelines (exact numbers), percentiles against numpy,
goodput, and the option parsers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixgate.lab.bench.specs import RequestResult
from prefixgate.lab.bench.stats import (
    goodput_count,
    parse_percentiles,
    parse_slo,
    peak_concurrency,
    percentile,
    summarize,
)


def req(start, ttft, itl, output_tokens, input_tokens=100, cached=0, visible=None, ok=True):
    latency = ttft + sum(itl)
    return RequestResult(
        success=ok,
        error="" if ok else "boom",
        start=start,
        ttft=ttft,
        ttft_visible=visible,
        latency=latency,
        itl=list(itl),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_tokens=cached,
        usage_seen=True,
    )


def test_tpot_is_latency_minus_ttft_over_tokens_minus_one():
    r = req(0.0, 0.100, [0.010] * 9, output_tokens=10)
    assert r.latency == pytest.approx(0.190)
    assert r.tpot() == pytest.approx(0.010)
    assert req(0.0, 0.1, [], output_tokens=1).tpot() is None
    assert req(0.0, 0.1, [0.01], output_tokens=5, ok=False).tpot() is None


def test_summary_of_two_requests_exact():
    a = req(0.0, 0.100, [0.010] * 9, output_tokens=10, input_tokens=100, cached=40, visible=0.120)
    b = req(0.5, 0.300, [0.020] * 4, output_tokens=5, input_tokens=300, cached=0)
    failed = req(0.2, 0.0, [], output_tokens=0, ok=False)
    s = summarize([a, b, failed], duration_s=2.0, percentiles=(50, 99))
    assert s["completed"] == 2 and s["failed"] == 1
    assert s["errors"] == ["boom"]
    assert s["total_input_tokens"] == 400
    assert s["total_output_tokens"] == 15
    assert s["total_cached_tokens"] == 40
    assert s["usage_cache_hit_rate"] == pytest.approx(10.0)
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_throughput"] == pytest.approx(7.5)
    assert s["total_token_throughput"] == pytest.approx(207.5)
    assert s["request_goodput"] is None  # no SLO given
    # TTFT: 100 and 300 ms
    assert s["mean_ttft_ms"] == pytest.approx(200.0)
    assert s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["std_ttft_ms"] == pytest.approx(100.0)
    assert s["p99_ttft_ms"] == pytest.approx(100 + 0.99 * 200)
    assert s["p50_ttft_ms"] == pytest.approx(200.0)
    # TPOT per request (10 ms, 20 ms), then averaged
    assert s["mean_tpot_ms"] == pytest.approx(15.0)
    assert s["decode_tok_s"] == pytest.approx(1000 / 15.0)
    # ITL pooled: nine 10 ms gaps and four 20 ms gaps
    assert s["mean_itl_ms"] == pytest.approx((9 * 10 + 4 * 20) / 13)
    assert s["median_itl_ms"] == pytest.approx(10.0)
    # E2EL: 190 and 380 ms
    assert s["mean_e2el_ms"] == pytest.approx(285.0)
    assert s["mean_ttft_visible_ms"] == pytest.approx(120.0)
    assert s["max_concurrent_requests"] == 1  # a ends at 0.19, b starts at 0.5


def test_empty_run_reports_zeros_like_vllm():
    s = summarize([req(0, 0, [], 0, ok=False)], duration_s=1.0)
    assert s["completed"] == 0 and s["failed"] == 1
    assert s["mean_ttft_ms"] == 0.0 and s["p99_tpot_ms"] == 0.0
    assert s["decode_tok_s"] is None
    assert "mean_ttft_visible_ms" not in s


def test_goodput_counts_requests_within_every_slo():
    fast = req(0.0, 0.050, [0.010] * 9, output_tokens=10)  # ttft 50, tpot 10, e2el 140
    slow_start = req(0.0, 0.400, [0.010] * 9, output_tokens=10)  # ttft 400
    slow_decode = req(0.0, 0.050, [0.050] * 9, output_tokens=10)  # tpot 50
    one_token = req(0.0, 0.050, [], output_tokens=1)  # tpot counts as 0
    rs = [fast, slow_start, slow_decode, one_token]
    assert goodput_count(rs, {"ttft": 100}) == 3
    assert goodput_count(rs, {"ttft": 100, "tpot": 20}) == 2
    assert goodput_count(rs, {"e2el": 140}) == 2  # equal to the SLO meets it
    s = summarize(rs, duration_s=4.0, slo_ms={"ttft": 100, "tpot": 20})
    assert s["request_goodput"] == pytest.approx(0.5)


def test_peak_concurrency():
    rs = [req(0.0, 0.1, [0.9], 2), req(0.5, 0.1, [0.9], 2), req(1.0, 0.1, [0.1], 2)]
    assert peak_concurrency(rs) == 2  # the first ends exactly when the third starts


@pytest.mark.parametrize("p", [0, 1, 25, 50, 90, 99, 99.9, 100])
def test_percentile_matches_numpy(p):
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)))


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
    st.floats(0, 100),
)
def test_percentile_matches_numpy_property(values, p):
    expected = float(np.percentile(values, p))
    assert math.isclose(percentile(values, p), expected, rel_tol=1e-9, abs_tol=1e-6)


def test_percentile_rejects_bad_input():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_parse_slo_and_percentiles():
    assert parse_slo("ttft_ms=500,tpot_ms=50") == {"ttft": 500.0, "tpot": 50.0}
    assert parse_slo("ttft:500 e2el:2000") == {"ttft": 500.0, "e2el": 2000.0}
    assert parse_slo(None) == {}
    with pytest.raises(ValueError):
        parse_slo("latency=3")
    with pytest.raises(ValueError):
        parse_slo("ttft_ms=0")
    assert parse_percentiles("50,90,99") == (50.0, 90.0, 99.0)
    assert parse_percentiles(None) == (99.0,)
    with pytest.raises(ValueError):
        parse_percentiles("120")
