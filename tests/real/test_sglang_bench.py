"""``prefixgate bench`` over the real vLLM and the real SGLang side by side, one scenario
matrix, one report (``benchmarks/engines.py`` runs the same command at full size for
docs/engines.md): every scenario completes on both engines, both report their prefix-cache
hits (the warm prefill, the agent's later turns), and the report names both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from engines import bench_args  # noqa: E402


def test_bench_compares_real_vllm_and_real_sglang_in_one_report(vllm, sglang, tmp_path, say):
    cmd = bench_args((vllm, sglang), tmp_path, 1, 16, 800)
    subprocess.run(cmd, check=True, timeout=1200, capture_output=True)
    doc = json.loads((tmp_path / "results.json").read_text())
    report = (tmp_path / "report.md").read_text()
    say("bench, vLLM and SGLang:\n" + report)
    assert set(doc["targets"]) == {"vllm-0.32", "sglang-0.5.23"}
    for name, target in doc["targets"].items():
        assert target["error"] is None, (name, target["error"])
        scenarios = target["scenarios"]
        assert set(scenarios) == {"decode", "prefill", "concurrency4", "concurrency8", "agent"}
        for scenario, summary in scenarios.items():
            assert summary["completed"] > 0 and summary["failed"] == 0, (name, scenario)
            assert summary["total_output_tokens"] > 0, (name, scenario)
        prefill = scenarios["prefill"]
        assert prefill["cached_tokens_warm"] > prefill["cached_tokens_cold"], name
        later = [t for t in scenarios["agent"]["agent_turns"] if t["turn"] > 1]
        assert later and all(t["mean_cached_tokens"] > 0 for t in later), name
    assert "vllm-0.32" in report and "sglang-0.5.23" in report
