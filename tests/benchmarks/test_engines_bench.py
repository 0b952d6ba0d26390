"""``benchmarks/engines.py``: the ``prefixgate bench`` command it runs over the two engines,
and the part of the report it writes into docs/engines.md (the engines themselves are
run by ``tests/real/test_sglang_bench.py``)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from click.testing import CliRunner

from prefixgate.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import engines  # noqa: E402

REPORT = """# prefixgate bench

Run `x`.

## Throughput (tok/s; hit rates in %)

| a | b |

## Latency, cache and capacity

| c | d |

## decode

| per-scenario | row |
"""


def test_the_doc_gets_the_summary_tables_under_its_section():
    text = engines.summary(REPORT)
    assert text.startswith("### prefixgate bench")
    assert "### Throughput" in text and "### Latency, cache and capacity" in text
    assert "decode" not in text and "per-scenario" not in text


def test_the_command_is_one_bench_over_both_engines(tmp_path):
    servers = (SimpleNamespace(base_url="http://a/v1"), SimpleNamespace(base_url="http://b/v1"))
    cmd = engines.bench_args(servers, tmp_path, 2, 32, 900)
    assert Path(cmd[0]).name == "prefixgate" and cmd[1] == "bench"
    targets = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--target"]
    assert targets == ["vllm-0.32=http://a/v1", "sglang-0.5.23=http://b/v1"]
    # every option it passes is one the command takes (parsed, up to the first request)
    result = CliRunner().invoke(main, [*cmd[1:], "--help"])
    assert result.exit_code == 0
    for option in (a for a in cmd[2:] if a.startswith("--")):
        assert option in result.output, option
