"""``prefixgate simulate`` through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from prefixgate.lab.simulate.command import simulate_command

from .test_traces import TINY


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in TINY))
    return path


def test_json_output(tmp_path: Path):
    res = CliRunner().invoke(simulate_command, [str(_trace(tmp_path)), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    agg = doc["runs"][0]["aggregate"]
    assert doc["source"]["requests"] == 4
    assert agg["id_hit_ratio"] == 7 / 12
    assert agg["token_hit_rate"] == 2560 / 4872
    assert "requests" not in doc["runs"][0]
    assert doc["runs"][0]["conventions"] == {
        "block_hit_ratio_ids_as_given": 7 / 12,
        "token_hit_rate_vllm": 2560 / 4872,
    }
    res = CliRunner().invoke(simulate_command, [str(_trace(tmp_path)), "--json", "--per-request"])
    assert [r["gpu_hit_tokens"] for r in json.loads(res.stdout)["runs"][0]["requests"]] == [
        0,
        1024,
        512,
        1024,
    ]


def test_table_output_with_host_and_prefill_rate(tmp_path: Path):
    args = [str(_trace(tmp_path)), "--gpu-capacity", "1K", "--host-capacity", "1M"]
    res = CliRunner().invoke(simulate_command, [*args, "--prefill-rate", "1000"])
    assert res.exit_code == 0, res.output
    assert "Block hit ratio, trace ids as given" in res.stdout
    assert "Token hit rate, vLLM rules" in res.stdout
    assert "Host writes (blocks)" in res.stdout
    assert "Prefill seconds saved" in res.stdout


def test_sweep_plot_writes_a_png(tmp_path: Path):
    png = tmp_path / "sweep.png"
    args = [str(_trace(tmp_path)), "--sweep", "512,1K,2K,unlimited", "--plot", str(png), "--json"]
    res = CliRunner().invoke(simulate_command, args)
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(res.stdout)
    assert doc["sweep"] and len(doc["runs"]) == 4


def test_scenario_json():
    res = CliRunner().invoke(simulate_command, ["--scenario", "seed-l2", "--json"])
    assert res.exit_code == 0, res.output
    runs = json.loads(res.stdout)["runs"]
    assert runs[0]["aggregate"]["host_loads"] == 0 and runs[1]["aggregate"]["host_loads"] > 0


def test_usage_errors(tmp_path: Path):
    runner = CliRunner()
    assert runner.invoke(simulate_command, []).exit_code == 2
    assert (
        runner.invoke(simulate_command, [str(_trace(tmp_path)), "--plot", "x.png"]).exit_code == 2
    )
    res = runner.invoke(simulate_command, [str(_trace(tmp_path)), "--gpu-capacity", "lots"])
    assert res.exit_code == 2
    res = runner.invoke(simulate_command, [str(tmp_path / "missing.jsonl")])
    assert res.exit_code == 1
    res = runner.invoke(simulate_command, [str(_trace(tmp_path)), "--groups", "bogus"])
    assert res.exit_code == 1 and "bad KV group" in res.output
