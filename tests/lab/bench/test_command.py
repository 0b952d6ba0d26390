"""``prefixgate bench`` through click's CliRunner against a fast simulated upstream and the
gateway in front of it: the out dir gets report.md, results.json, results.csv and PNGs."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from prefixgate.lab.bench.command import bench_command, parse_targets
from prefixgate.lab.bench.scenarios import ALL_SCENARIOS

from .conftest import Stack, sim_stack

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def fast() -> Iterator[Stack]:
    with sim_stack(prefill_tokens_per_s=500_000, decode_tokens_per_s=4_000) as s:
        yield s


SMALL = ["--runs", "1", "--output-tokens", "16", "--prefill-tokens", "200"]


def test_cli_writes_the_out_dir(fast, tmp_path):
    out = tmp_path / "out"
    args = [
        "--target", f"direct={fast.openai_url}",
        "--target", f"gw:anthropic={fast.gateway_url}",
        "--metrics-url", f"gw={fast.metrics_url}",
        "--scenarios", "all",
        *SMALL,
        "--num-prompts", "6", "--concurrency", "2", "--rate", "100",
        "--arrival", "gamma", "--burstiness", "0.5",
        "--slo", "ttft_ms=5000,tpot_ms=100",
        "--percentiles", "50,90,99",
        "--out", str(out),
    ]  # fmt: skip
    r = CliRunner().invoke(bench_command, args)
    assert r.exit_code == 0, (r.output, r.stderr)
    for name in ("report.md", "results.json", "results.csv"):
        assert (out / name).stat().st_size > 0
    for name in ("ttft.png", "decode.png", "throughput.png", "agent.png"):
        assert (out / name).read_bytes()[:8] == PNG

    data = json.loads((out / "results.json").read_text())
    assert set(data["targets"]) == {"direct", "gw"}
    assert data["meta"]["scenarios"] == list(ALL_SCENARIOS)
    for name, t in data["targets"].items():
        assert t["error"] is None and t["model"] == "sim-model"
        assert set(t["scenarios"]) == set(ALL_SCENARIOS)
        for sname, s in t["scenarios"].items():
            assert s["failed"] == 0 and s["completed"] > 0, (name, sname, s["errors"])
            for key in ("mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
                        "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms", "output_throughput",
                        "total_token_throughput", "request_throughput", "total_input_tokens",
                        "total_output_tokens", "completed"):  # fmt: skip
                assert isinstance(s[key], int | float), (sname, key)
            assert s["request_goodput"] is not None
            assert "server_prefix_cache_hit_rate" in s  # the gateway reads its upstream's
        assert t["scenarios"]["prefill"]["cached_tokens_warm"] > 0
        assert t["scenarios"]["decode"]["total_output_tokens"] == 16
    assert data["targets"]["gw"]["api"] == "anthropic"

    rows = list(csv.DictReader(io.StringIO((out / "results.csv").read_text())))
    assert len(rows) == 2 * len(ALL_SCENARIOS)
    assert {r["configuration"] for r in rows} == {"direct", "gw"}

    md = (out / "report.md").read_text()
    assert "| Configuration | Decode (short prompt) | Think-on | Long-prefill |" in md
    assert "| direct |" in md and "| gw |" in md and "### agent turns: gw" in md
    assert "## Errors" not in md
    assert "| Configuration |" in r.stdout  # not a TTY: the markdown report


def test_cli_json_output(fast):
    r = CliRunner().invoke(
        bench_command,
        ["--target", f"sim={fast.openai_url}", "--scenarios", "decode", *SMALL, "--json",
         "--no-progress"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    s = data["targets"]["sim"]["scenarios"]["decode"]
    assert s["completed"] == 1 and s["total_output_tokens"] == 16
    assert s["request_goodput"] is None  # no --slo
    assert len(s["requests"]) == 1


def test_cli_fails_when_a_target_cannot_be_reached(fast):
    r = CliRunner().invoke(
        bench_command,
        ["--target", f"gone={fast.upstream.url}/missing/v1", "--scenarios", "decode", *SMALL,
         "--no-progress"],
    )  # fmt: skip
    assert r.exit_code == 1
    assert "cannot list models" in r.stderr


def test_cli_rejects_bad_options():
    runner = CliRunner()
    assert runner.invoke(bench_command, ["--target", "nourl"]).exit_code == 2
    assert runner.invoke(bench_command, ["--target", "a:grpc=http://x"]).exit_code == 2
    r = runner.invoke(bench_command, ["--target", "a=http://x", "--scenarios", "warp"])
    assert r.exit_code == 2 and "unknown" in r.output
    r = runner.invoke(bench_command, ["--target", "a=http://x", "--slo", "speed=3"])
    assert r.exit_code == 2


def test_parse_targets():
    ts = parse_targets(("v=http://h:8000/v1/", "g:anthropic=http://h:8787"), "openai", ("g=none",))
    assert [(t.name, t.api, t.url) for t in ts] == [
        ("v", "openai", "http://h:8000/v1"),
        ("g", "anthropic", "http://h:8787"),
    ]
    assert ts[0].scrape_url() == "http://h:8000/metrics" and ts[1].scrape_url() is None
