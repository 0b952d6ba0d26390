"""The conversion micro-benchmark (benchmarks/convert.py) runs, and its three ways from
the Claude Code request to the upstream request agree (it asserts so before timing); the
real Codex request goes through the Responses path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_convert_benchmark_reports_every_figure() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH / "convert.py"), "-n", "20", "--chunks", "16", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    figures = json.loads(out.stdout)
    names = ("decode", "convert", "request_path", "plain_path", "dict_api", "stream_16_chunks")
    for name in (*names, "codex_path", "codex_stream_16_chunks"):
        assert figures[name]["p50_ms"] > 0, name
    assert figures["stream_per_chunk_us"] > 0
