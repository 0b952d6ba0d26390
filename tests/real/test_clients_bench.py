"""``benchmarks/clients.py`` (the hit-rate table of docs/clients.md) runs and reports each
figure, here for the Codex CLI on the simulated vLLM (the real vLLM rows are what the
tests beside this one check)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_clients_benchmark_reports_the_second_turn_hit(codex_exe):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "clients.py"),
            "--upstream",
            "sim",
            "--clients",
            "codex",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=True,
    )
    (row,) = json.loads(out.stdout)
    assert (row["client"], row["endpoint"], row["upstream"]) == (
        "Codex CLI",
        "/v1/responses",
        "simulated",
    )
    assert row["turn2_prompt_tokens"] > row["turn1_prompt_tokens"] > 5_000
    assert row["turn2_hit_rate"] == row["turn2_cached_tokens"] / row["turn2_prompt_tokens"]
    assert row["turn2_hit_rate"] > 0.9
    assert "Codex CLI" in out.stderr  # progress goes to stderr


def test_the_clients_benchmark_refuses_an_unknown_client():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "clients.py"), "--clients", "cursor"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.returncode == 2 and "unknown clients: cursor" in out.stderr
