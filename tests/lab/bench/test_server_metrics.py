"""``/metrics`` parsing and counter deltas (prefix cache, speculative decoding, KV pool)."""

from __future__ import annotations

import pytest

from prefixgate.lab.bench.server_metrics import counter_deltas, parse_metrics

BEFORE = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 500.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 200.0
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{model_name="m"} 10.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{model_name="m"} 70.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 30.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 9.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="15358",enable_prefix_caching="True"} 1.0
"""

AFTER = (
    BEFORE.replace("} 1000.0", "} 2600.0")
    .replace("} 200.0", "} 1400.0")
    .replace('num_drafts_total{model_name="m"} 10.0', 'num_drafts_total{model_name="m"} 110.0')
    .replace("} 70.0", "} 770.0")
    .replace('tokens_total{model_name="m"} 30.0', 'tokens_total{model_name="m"} 280.0')
)


def test_parse_sums_over_labels_and_reads_the_kv_pool():
    snap = parse_metrics(BEFORE)
    assert snap.values["vllm:prefix_cache_queries_total"] == 1500.0
    assert snap.kv_capacity_tokens == 15358 * 16


def test_deltas_give_hit_rate_and_speculative_acceptance():
    d = counter_deltas(parse_metrics(BEFORE), parse_metrics(AFTER))
    assert d["server_prefix_cache_queries"] == 1600
    assert d["server_prefix_cache_hits"] == 1200
    assert d["server_prefix_cache_hit_rate"] == pytest.approx(75.0)
    assert d["spec_decode_num_drafts"] == 100
    assert d["spec_decode_draft_tokens"] == 700
    assert d["spec_decode_accepted_tokens"] == 250
    assert d["spec_decode_acceptance_rate"] == pytest.approx(250 / 700 * 100)
    assert d["spec_decode_acceptance_length"] == pytest.approx(1 + 250 / 100)


def test_server_side_latency_from_histogram_deltas():
    hist = (
        'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {ttft}\n'
        'vllm:time_to_first_token_seconds_count{{model_name="m"}} {n}\n'
        'vllm:inter_token_latency_seconds_sum{{model_name="m"}} {itl}\n'
        'vllm:inter_token_latency_seconds_count{{model_name="m"}} {k}\n'
    )
    before = parse_metrics(hist.format(ttft=1.0, n=10, itl=2.0, k=100))
    after = parse_metrics(hist.format(ttft=1.5, n=14, itl=2.5, k=200))
    d = counter_deltas(before, after)
    assert d["server_mean_ttft_ms"] == pytest.approx(125.0)
    assert d["server_mean_itl_ms"] == pytest.approx(5.0)
    assert "server_mean_e2el_ms" not in d


def test_no_counters_no_figures():
    other = parse_metrics("# TYPE prefixgate_requests_total counter\nprefixgate_requests_total 3\n")
    assert counter_deltas(other, other) == {}
    assert counter_deltas(None, parse_metrics(AFTER)) == {}
    assert other.kv_capacity_tokens is None


def test_legacy_gpu_prefix_cache_names():
    before = parse_metrics(
        "vllm:gpu_prefix_cache_queries_total 10\nvllm:gpu_prefix_cache_hits_total 5\n"
    )
    after = parse_metrics(
        "vllm:gpu_prefix_cache_queries_total 30\nvllm:gpu_prefix_cache_hits_total 15\n"
    )
    assert counter_deltas(before, after)["server_prefix_cache_hit_rate"] == pytest.approx(50.0)
