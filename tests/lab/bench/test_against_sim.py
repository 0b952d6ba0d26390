"""End to end against the simulated vLLM with KNOWN rates (prefill 20,000 tok/s, decode
200 tok/s): directly (OpenAI Chat) and through the gateway's ``/v1/messages`` and
``/v1/responses``.

The simulator sleeps ``uncached_prompt_tokens / prefill_rate`` before the first token and
``1 / decode_rate`` per further token, so the expected TTFT of a request is computed from
ITS OWN usage figures, and the expected decode rate is the configured one.

No bound here depends on how busy the machine is: a loaded machine can only make the
simulator late, never early, so each timed figure is checked on the side the simulator's
sleeps guarantee (a decode no faster than configured, a cold first token no sooner than
its prefill), and beside that, the figures the bench derives must agree exactly with the
requests it timed. How close the bench comes to the configured rates on a quiet machine is
a measurement, not a test: ``prefixgate bench`` against ``prefixgate upstream-sim``.
"""

from __future__ import annotations

import asyncio
import statistics

import pytest

from prefixgate.lab.bench.runner import run_bench
from prefixgate.lab.bench.scenarios import ScenarioParams
from prefixgate.lab.bench.specs import Target

from .conftest import DECODE_RATE, PREFILL_RATE

# Timer granularity: a sleep may end a little early by the clock the client reads.
SLACK = 1.02


def no_faster(rate: float, configured: float) -> bool:
    """A rate the simulator's sleeps allow: at most the configured one."""
    return 0 < rate <= configured * SLACK


def bench(targets, names, params=None, **kw):
    return asyncio.run(run_bench(targets, names, params or ScenarioParams(), **kw))


def expected_ttft(r) -> float:
    return (r.input_tokens - r.cached_tokens) / PREFILL_RATE


def check_decode_and_prefill(tr) -> None:
    assert tr.error is None
    decode = tr.scenarios["decode"].summary
    assert decode["completed"] == 3 and decode["failed"] == 0
    assert decode["total_output_tokens"] == 3 * 256
    assert no_faster(decode["decode_tok_s"], DECODE_RATE), decode["decode_tok_s"]
    assert decode["median_tpot_ms"] > 0

    prefill = tr.scenarios["prefill"]
    s = prefill.summary
    assert s["completed"] == 2 * ACCURACY.prefill_runs and s["failed"] == 0
    colds = [r for r in prefill.requests if r.label == "cold"]
    warms = [r for r in prefill.requests if r.label == "warm"]
    assert len(colds) == len(warms) == ACCURACY.prefill_runs
    assert all(r.cached_tokens == 0 and r.input_tokens > 12_000 for r in colds)
    # the summary is the median of what was timed
    assert s["ttft_cold_ms"] == pytest.approx(statistics.median(r.ttft for r in colds) * 1000)
    assert s["ttft_warm_ms"] == pytest.approx(statistics.median(r.ttft for r in warms) * 1000)
    # each cold first token waited at least its own prefill (uncached tokens / rate)
    assert all(r.ttft >= expected_ttft(r) / SLACK for r in colds)
    # the warm run repeats the prompt: everything but the last partial block hits
    assert all(w.cached_tokens >= w.input_tokens - 16 for w in warms)
    assert s["cached_tokens_warm"] > 0
    assert s["prefill_tok_s_from_hit"] > 0
    # the server's own counters agree with the usage figures
    assert (
        s["server_prefix_cache_hits"]
        == s["total_cached_tokens"]
        == sum(w.cached_tokens for w in warms)
    )
    assert s["server_prefix_cache_queries"] == s["total_input_tokens"]
    # the server's own TTFT (its histogram) is the prefill sleep; the client's includes HTTP
    assert 0 < s["server_mean_ttft_ms"] <= s["mean_ttft_ms"]


# A prompt long enough that the fixed per-request cost (HTTP, JSON, rendering; ~3 ms
# direct, ~10-15 ms through the gateway on a busy 2-core machine) is small next to the
# prefill time: 12,000 tokens at 20,000 tok/s is 600 ms. Five cold/warm pairs, medians.
ACCURACY = ScenarioParams(
    runs=3,
    output_tokens=256,
    long_prompt_tokens=12_000,
    prefill_runs=5,
    prefill_output_tokens=16,
)


def test_openai_direct_matches_configured_rates(stack):
    run = bench([Target("sim", stack.openai_url)], ["decode", "prefill"], ACCURACY)
    check_decode_and_prefill(run.targets[0])


def test_gateway_anthropic_matches_configured_rates(stack):
    target = Target("gateway", stack.gateway_url, api="anthropic", metrics_url=stack.metrics_url)
    run = bench([target], ["decode", "prefill"], ACCURACY, model="sim-model")
    check_decode_and_prefill(run.targets[0])


def test_gateway_responses_matches_configured_rates(stack):
    target = Target("gateway", stack.gateway_url, api="responses", metrics_url=stack.metrics_url)
    run = bench([target], ["decode", "prefill"], ACCURACY, model="sim-model")
    check_decode_and_prefill(run.targets[0])


@pytest.mark.parametrize("api", ["openai", "anthropic", "responses"])
def test_thinking_reports_visible_ttft_after_reasoning(stack, api):
    url = stack.openai_url if api == "openai" else stack.gateway_url
    params = ScenarioParams(runs=1, output_tokens=64)
    run = bench([Target(api, url, api=api)], ["thinking"], params, model="sim-model")
    [r] = run.targets[0].scenarios["thinking"].requests
    assert r.success and r.output_tokens == 64
    assert r.reasoning_chars > 0
    # about half the output is reasoning: the visible text starts ~32 tokens later
    assert r.ttft_visible is not None
    assert r.ttft_visible - r.ttft > 0.5 * 30 / DECODE_RATE


def test_concurrency_aggregates_and_report_defaults(stack):
    params = ScenarioParams(concurrent_output_tokens=128)
    run = bench([Target("sim", stack.openai_url)], ["concurrency4"], params)
    s = run.targets[0].scenarios["concurrency4"].summary
    assert s["completed"] == 4 and s["total_output_tokens"] == 4 * 128
    assert s["max_concurrent_requests"] == 4
    assert no_faster(s["decode_tok_s"], DECODE_RATE)
    assert s["output_throughput"] == pytest.approx(s["total_output_tokens"] / s["duration"])
    # four streams at 200 tok/s each at most (a starved machine can only slow them)
    assert no_faster(s["output_throughput"], 4 * DECODE_RATE)


def test_agent_shared_prefix_and_load(stack):
    params = ScenarioParams(
        agent_sessions=2,
        agent_turns=4,
        agent_system_tokens=400,
        agent_user_tokens=60,
        agent_output_tokens=16,
        shared_groups=2,
        shared_group_size=3,
        shared_prefix_tokens=400,
        shared_output_tokens=8,
        load_requests=12,
        load_prompt_tokens=64,
        load_output_tokens=8,
        rate=40.0,
        burstiness=0.5,
        concurrency=4,
    )
    run = bench(
        [Target("sim", stack.openai_url)],
        ["agent", "shared-prefix", "load"],
        params,
        slo_ms={"ttft": 10_000.0},
    )
    tr = run.targets[0]
    turns = tr.scenarios["agent"].summary["agent_turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3, 4]
    assert turns[0]["mean_cached_tokens"] == 0
    cached = [t["mean_cached_tokens"] for t in turns]
    assert all(b > a for a, b in zip(cached, cached[1:], strict=False))  # history grows, hits
    shared = tr.scenarios["shared-prefix"]
    firsts = [r for r in shared.requests if r.label == "first"]
    rest = [r for r in shared.requests if r.label == "shared"]
    assert all(r.cached_tokens == 0 for r in firsts)
    assert all(r.cached_tokens >= 380 for r in rest)
    load = tr.scenarios["load"].summary
    assert load["completed"] == 12 and load["failed"] == 0
    assert load["max_concurrent_requests"] <= 4
    assert load["request_goodput"] == pytest.approx(load["request_throughput"])


def test_failures_are_counted_not_raised(stack):
    bad = Target("missing", stack.upstream.url + "/nope/v1")
    run = bench([bad], ["decode"], ScenarioParams(runs=1), model="m", warmup=False)
    s = run.targets[0].scenarios["decode"].summary
    assert s["completed"] == 0 and s["failed"] == 1
    assert "HTTP 404" in s["errors"][0]
    unlisted = bench([bad], ["decode"], ScenarioParams(runs=1))
    assert "cannot list models" in unlisted.targets[0].error
