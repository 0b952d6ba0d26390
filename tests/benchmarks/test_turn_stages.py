"""benchmarks/turn_stages.py without valgrind: how many turns a stage's run holds, and a
stage's cold runs (``--misses``: each after the caches were filled with other data) going
through the request path's stages of a short session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import turn_stages as ts  # noqa: E402


def test_a_lent_stage_holds_two_turns_and_a_tenfold_one_ten():
    assert ts._runs_in("decode_lent") == 2
    assert ts._runs_in("encode_lent") == 2
    assert ts._runs_in("ledgers_10") == 10
    assert ts._runs_in("capture_made") == 1


def test_the_cold_runs_of_a_stage_run_it_after_each_sweep():
    # --inner with --cold, outside valgrind: what --misses counts under it (the session's
    # turns, then the stage's warm runs and its cold ones), here a session of three turns
    for stage in ("capture_made", "nonesuch"):
        done = subprocess.run(
            [
                sys.executable,
                str(BENCH / "turn_stages.py"),
                "--inner",
                "--turn",
                "2",
                "--stages",
                stage,
                "--cold",
                "1",
            ],  # fmt: skip
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert ("missing" in done.stdout) == (stage == "nonesuch")
