"""The reliability benchmark (benchmarks/reliability.py): its table of cases, and a short
run of the durability cases against the real processes, each row beside its goal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ADMIN_DSN

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "reliability.py"


def run(*args: str) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", "--pg", ADMIN_DSN, *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[reliability]" in proc.stderr  # progress goes to stderr, the table to stdout
    return json.loads(proc.stdout)


@pytest.mark.postgres
def test_short_durability_run_reports_each_case_beside_its_goal() -> None:
    rows = run(
        *("--case", "sigkill_sqlite", "--case", "store_lock", "--case", "store_down"),
        *("--runs", "1", "--streams", "200", "--concurrency", "16"),
        *("--lock-seconds", "3", "--store-down-minutes", "0.05"),
    )
    assert [r["case"] for r in rows] == ["sigkill_sqlite", "store_lock", "store_down"]
    for r in rows:
        assert set(r) == {"case", "result", "goal", "met"}
        assert r["met"] is True, r
    assert rows[0]["result"].startswith("0 completed requests without a record")
    assert "before the SIGKILL" in rows[1]["result"]


def test_an_unknown_case_is_refused() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--case", "nope"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
