"""Upstream cache health from /metrics snapshots and engine logs."""

from prefixgate.doctor import diagnose, exit_code
from prefixgate.doctor import upstream_health as uh
from prefixgate.lab.upstream_sim import SimSettings, create_upstream_app
from prefixgate.serve.process import ServerThread


def snapshot(
    stored: float, loaded: float, ext_q: float, ext_h: float, q: float = 1e6, h: float = 8e5
) -> str:
    return f"""# HELP vllm:kv_offload_total_bytes Bytes moved by the KV offloading connector.
# TYPE vllm:kv_offload_total_bytes counter
vllm:kv_offload_total_bytes_total{{model_name="m",transfer_type="GPU_to_CPU"}} {stored}
vllm:kv_offload_total_bytes_total{{model_name="m",transfer_type="CPU_to_GPU"}} {loaded}
# TYPE vllm:external_prefix_cache_queries counter
vllm:external_prefix_cache_queries_total{{model_name="m"}} {ext_q}
# TYPE vllm:external_prefix_cache_hits counter
vllm:external_prefix_cache_hits_total{{model_name="m"}} {ext_h}
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{model_name="m"}} {q}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{model_name="m"}} {h}
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="64",model_name="m"}} 1.0
"""


def kinds(d):
    return [f.kind for f in d.findings]


def test_two_snapshots_of_a_write_only_l2(tmp_path):
    snaps = [
        ("h200:8000", snapshot(2.0e10, 0, 5e5, 0)),
        ("h200:8000", snapshot(2.6e10, 0, 7e5, 0, 2e6, 1.7e6)),
    ]
    d = diagnose(f"sqlite:///{tmp_path / 'x.db'}", metrics_snapshots=snaps)
    [f] = [f for f in d.findings if f.kind == "l2_write_only"]
    assert f.facts["store_bytes"] == 6e9 and f.facts["load_bytes"] == 0
    assert f.facts["snapshots"] == 2 and f.facts["block_size"] == 64
    assert "veto" in " ".join(f.summary) and "recompute" in " ".join(f.fix)
    assert exit_code(d) == 0  # a warning


def test_one_cumulative_snapshot():
    f = uh.metrics_finding("x", [uh.parse_metrics(snapshot(1.98e10, 0, 9e5, 0))])
    assert f is not None and "since the server started" in f.summary[0]


def test_a_working_l2_is_not_flagged():
    first, last = (
        uh.parse_metrics(snapshot(1e10, 1e9, 5e5, 1e5)),
        uh.parse_metrics(snapshot(2e10, 3e9, 7e5, 2e5)),
    )
    assert uh.metrics_finding("x", [first, last]) is None
    # no host tier at all: nothing stored, nothing queried
    assert uh.metrics_finding("x", [uh.parse_metrics(snapshot(0, 0, 0, 0))]) is None


SEED_LOG = """\
INFO 08-07 02:48:01 kv_transfer_config=KVTransferConfig(kv_connector='OffloadingConnector', kv_role='kv_both')
INFO 08-07 02:48:02 [scheduler.py:194] KV offloading: EAGLE/MTP draft attention groups [2] detected. The trailing chunk of these groups will be excluded from offloading due to volatility.
INFO 08-18 09:25:22 Engine 000: Avg prompt throughput: 1200.0 tokens/s, GPU KV cache usage: 0.5%, Prefix cache hit rate: 88.3%, External prefix cache hit rate: 0.0%
INFO 08-18 09:25:24 Engine 000: Avg prompt throughput: 34844.0 tokens/s, GPU KV cache usage: 3.1%, Prefix cache hit rate: 88.3%, External prefix cache hit rate: 0.0%
INFO 08-18 09:25:24 kv_offload_store_bytes store_bytes=20646236160
INFO 08-18 09:25:30 Engine 000: Avg prompt throughput: 900.0 tokens/s, GPU KV cache usage: 2.0%, Prefix cache hit rate: 88.5%, External prefix cache hit rate: 0.0%
"""


def test_engine_log_of_a_write_only_l2(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(SEED_LOG)
    d = diagnose(f"sqlite:///{tmp_path / 'x.db'}", engine_log=log)
    [f] = [f for f in d.findings if f.kind == "l2_write_only"]
    assert f.facts["external_zero_lines"] == 3 and f.facts["load_lines"] == 0
    assert f.facts["draft_groups"]
    rows = dict((r[0], r[1]) for r in f.evidence[0].rows)
    assert rows["lowest GPU KV usage while External was 0.0%"] == "0.5%"


def test_engine_log_with_loads_is_healthy(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(
        SEED_LOG.replace(
            "88.5%, External prefix cache hit rate: 0.0%",
            "88.5%, External prefix cache hit rate: 41.2%",
        )
    )
    d = diagnose(f"sqlite:///{tmp_path / 'x.db'}", engine_log=log)
    assert "l2_write_only" not in kinds(d)


def test_missing_log_and_dead_metrics_url_are_notes(tmp_path):
    d = diagnose(
        f"sqlite:///{tmp_path / 'x.db'}",
        engine_log=tmp_path / "nope.log",
        metrics_urls=["http://127.0.0.1:9/metrics"],
    )
    assert len(d.notes) >= 2 and kinds(d) == ["no_problem"]


def test_metrics_url_gives_the_block_size(seed_dsn):
    app = create_upstream_app(SimSettings(block_size=64, models=("m",)))
    with ServerThread(app) as srv:
        d = diagnose(seed_dsn, metrics_urls=[srv.url + "/metrics"])
    [f] = [f for f in d.findings if f.kind == "prefix_broken"]
    assert f.facts["block_size"] == 64
    assert "l2_write_only" not in kinds(d)
