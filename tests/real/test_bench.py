"""`prefixgate bench` against the real vLLM, directly and through the gateway's
/v1/messages: the runs complete, usage and cache hits come through."""

from __future__ import annotations

import asyncio

from prefixgate.config import parse_config
from prefixgate.lab.bench import tables
from prefixgate.lab.bench.runner import run_bench
from prefixgate.lab.bench.scenarios import ScenarioParams
from prefixgate.lab.bench.specs import Target
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread


def test_bench_runs_against_real_vllm_and_the_gateway(vllm):
    config = parse_config(
        {
            "channels": [{"name": "real", "base_url": vllm.base_url}],
            "store": None,
            "server": {"shed_loop_lag": None},  # a late loop beside vLLM is the machine's
        }
    )
    params = ScenarioParams(
        runs=1, output_tokens=16, long_prompt_tokens=600, concurrent_output_tokens=8
    )
    with ServerThread(create_app(config)) as gw:
        targets = [
            Target("vllm", vllm.base_url, "openai"),
            Target("gateway", gw.url, "anthropic", metrics_url=vllm.url + "/metrics"),
        ]
        run = asyncio.run(
            run_bench(
                targets, ["decode", "prefill", "concurrency4"], params, model="tiny", warmup=False
            )
        )
    doc = tables.to_json(run)
    for name in ("vllm", "gateway"):
        t = doc["targets"][name]
        assert t["error"] is None, t["error"]
        for scenario, summary in t["scenarios"].items():
            assert summary["completed"] > 0 and summary["failed"] == 0, (
                name,
                scenario,
                summary["errors"],
            )
            assert summary["total_output_tokens"] > 0, (name, scenario)
    assert "gateway" in tables.to_markdown(run)
