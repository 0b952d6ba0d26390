"""The report on a hand-made run: the side-by-side tables, notes on figures to distrust,
JSON and CSV shapes, and the package's public surface."""

from __future__ import annotations

import csv
import io

import prefixgate.lab.bench as bench
from prefixgate.lab.bench.runner import BenchRun, ScenarioRun, TargetRun
from prefixgate.lab.bench.specs import RequestResult, Target
from prefixgate.lab.bench.stats import summarize
from prefixgate.lab.bench.tables import headline_rows, problems, to_csv, to_json, to_markdown


def result(output_tokens: int, max_tokens: int = 256, **kw) -> RequestResult:
    return RequestResult(
        success=True,
        start=0.0,
        ttft=0.1,
        latency=0.1 + 0.005 * (output_tokens - 1),
        input_tokens=50,
        output_tokens=output_tokens,
        max_tokens=max_tokens,
        usage_seen=True,
        **kw,
    )


def make_run() -> BenchRun:
    runs = []
    for name, api, out in (("vllm", "openai", 256), ("gw", "anthropic", 32)):
        rs = [result(out) for _ in range(3)]
        summary = summarize(rs, 1.0, percentiles=(50, 99)) | {"server_prefix_cache_queries": 150}
        summary |= {"server_prefix_cache_hits": 30, "server_prefix_cache_hit_rate": 20.0}
        tr = TargetRun(Target(name, f"http://{name}", api), model="m", kv_capacity_tokens=1024)
        tr.scenarios["decode"] = ScenarioRun(
            "decode", "Decode (short prompt)", "decode_tok_s", summary, rs
        )
        runs.append(tr)
    runs.append(TargetRun(Target("down", "http://down"), error="cannot list models"))
    meta = {"run_id": "r1", "date": "d", "percentiles": [50, 99]}
    return BenchRun(meta, runs, ["decode"])


def test_side_by_side_tables_and_notes():
    run = make_run()
    header, rows = headline_rows(run)
    assert header == ["Configuration", "Decode (short prompt)"]
    assert rows[0] == ["vllm", "200.0"] and rows[1] == ["gw", "200.0"] and rows[2] == ["down", "–"]
    errors, notes = problems(run)
    assert errors == ["- **down**: cannot list models"]
    assert len(notes) == 1 and "gw / decode: 3 of 3 outputs stopped before max_tokens" in notes[0]
    md = to_markdown(run)
    assert "| Server prefix-cache hit % |" in md and "| 20.0% | 1,024 | 0 |" in md
    assert "| KV pool (tokens) |" in md
    assert "| p50_ttft_ms |" not in md  # the median row says it
    assert "| median_ttft_ms | 100.0 | 100.0 |" in md


def test_json_and_csv_shapes():
    run = make_run()
    data = to_json(run)
    s = data["targets"]["vllm"]["scenarios"]["decode"]
    assert s["mean_ttft_ms"] == 100.0 and s["p50_ttft_ms"] == 100.0
    assert s["completed"] == 3 and len(s["requests"]) == 3
    assert data["targets"]["vllm"]["server_totals"]["server_prefix_cache_hit_rate"] == 20.0
    assert data["targets"]["down"]["error"] == "cannot list models"
    rows = list(csv.DictReader(io.StringIO(to_csv(run))))
    assert [r["configuration"] for r in rows] == ["vllm", "gw"]
    assert rows[1]["total_output_tokens"] == "96"


def test_public_surface():
    assert sorted(bench.__all__) == sorted(
        [
            "ALL_SCENARIOS",
            "REPORT_SET",
            "BenchRun",
            "RequestResult",
            "RequestSpec",
            "ScenarioParams",
            "Target",
            "run_bench",
            "to_csv",
            "to_json",
            "to_markdown",
            "write_outputs",
        ]
    )
