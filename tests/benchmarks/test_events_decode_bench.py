"""The event-decoding benchmark (benchmarks/events_decode.py) runs and reports a figure for
every traffic shape and payload layout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_events_decode_benchmark_reports_every_figure() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH / "events_decode.py"),
            "--batches",
            "4",
            "--repeat",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    figures = json.loads(out.stdout)["figures"]
    names = {
        f"{s}/{e}" for s in ("prefill", "decode", "churn") for e in ("map", "array", "map-batch")
    }
    assert set(figures) == names
    for name, f in figures.items():
        for key in ("decode_blocks_per_s", "generic_blocks_per_s", "ratio", "index_blocks_per_s"):
            assert f[key] > 0, (name, key)
