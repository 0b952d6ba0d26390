"""The bench's scenario matrix over the real vLLM and the real SGLang side by side, in one
run and one report, small (``benchmarks/engines.py`` runs ``prefixgate bench`` at full
size for docs/engines.md): every scenario completes on both engines, both report their
prefix-cache hits (the warm prefill, the agent's later turns), and the report names both.
Small because SGLang's CPU fallback decodes a few tokens a second here."""

from __future__ import annotations

import asyncio

from prefixgate.lab.bench import tables
from prefixgate.lab.bench.runner import run_bench
from prefixgate.lab.bench.scenarios import ScenarioParams
from prefixgate.lab.bench.specs import Target

SCENARIOS = ["decode", "prefill", "concurrency4", "concurrency8", "agent"]


def test_bench_compares_real_vllm_and_real_sglang_in_one_report(vllm, sglang, say):
    params = ScenarioParams(
        runs=1,
        output_tokens=8,
        long_prompt_tokens=700,
        concurrent_output_tokens=4,
        agent_sessions=2,
        agent_turns=2,
        agent_system_tokens=400,
        agent_user_tokens=40,
        agent_output_tokens=4,
    )
    targets = [
        Target("vllm-0.32", vllm.base_url, "openai"),
        Target("sglang-0.5.23", sglang.base_url, "openai"),
    ]
    run = asyncio.run(run_bench(targets, SCENARIOS, params, model="tiny", warmup=False))
    doc, text = tables.to_json(run), tables.to_markdown(run)
    say("bench, vLLM and SGLang:\n" + text.split("\n## decode")[0])
    assert set(doc["targets"]) == {"vllm-0.32", "sglang-0.5.23"}
    for name, target in doc["targets"].items():
        assert target["error"] is None, (name, target["error"])
        scenarios = target["scenarios"]
        assert set(scenarios) == set(SCENARIOS)
        for scenario, summary in scenarios.items():
            assert summary["completed"] > 0 and summary["failed"] == 0, (name, scenario)
            assert summary["total_output_tokens"] > 0, (name, scenario)
        prefill = scenarios["prefill"]
        assert prefill["cached_tokens_warm"] > prefill["cached_tokens_cold"], name
        later = [t for t in scenarios["agent"]["agent_turns"] if t["turn"] > 1]
        assert later and all(t["mean_cached_tokens"] > 0 for t in later), name
    assert "vllm-0.32" in text and "sglang-0.5.23" in text
