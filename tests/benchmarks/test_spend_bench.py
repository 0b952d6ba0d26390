"""The spend benchmarks run and report every figure: the steps of benchmarks/spend_overhead.py
(budgets, telemetry) and a small week of benchmarks/usage_week.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_spend_overhead_reports_every_step() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH / "spend_overhead.py"), "-n", "200", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    steps = {s["step"]: s for s in json.loads(out.stdout)["steps"]}
    for name in (
        "budget reserve, memory",
        "budget settle, memory",
        "budget reserve, Redis",
        "telemetry span (on the loop)",
    ):
        assert steps[name]["p50_ms"] > 0, name
    assert steps["telemetry span (on the loop)"]["exported"] > 0
    assert steps["telemetry off"]["opentelemetry_imported"] is False


def test_a_small_week_is_priced_and_the_fix_shows(tmp_path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH / "usage_week.py"),
            "--sessions",
            "2",
            "--turns",
            "4",
            "--out",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    week = json.loads(out.stdout)
    assert week["days"] == 7
    assert [r["requests"] for r in week["by_day"]["rows"]] == [8] * 7
    assert week["cost_per_day_header_kept"] > week["cost_per_day_header_stripped"] > 0
    assert week["lost_per_day_header_kept"] > 0
