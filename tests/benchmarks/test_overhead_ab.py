"""The A/B tool (benchmarks/overhead_ab.py): its case and setting syntax, and a short run
of two settings side by side that reports both, with no failed request."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _tool():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("overhead_ab", BENCH / "overhead_ab.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_cases_and_settings_parse() -> None:
    ab = _tool()
    assert ab.parse_case("messages/stream") == ("messages", True, 1, "fake")
    assert ab.parse_case("chat/json/32") == ("chat", False, 32, "fake")
    for bad in ("chat", "embeddings/json", "chat/xml", "chat/json/1/2"):
        with pytest.raises(argparse.ArgumentTypeError):
            ab.parse_case(bad)
    config = {"server": {"port": 1}}
    ab.apply_set(config, "server.busy_poll_us=0")
    ab.apply_set(config, "limits.max_tools=3")
    ab.apply_set(config, "server.host=127.0.0.1")  # not JSON: a string
    assert config == {
        "server": {"port": 1, "busy_poll_us": 0, "host": "127.0.0.1"},
        "limits": {"max_tools": 3},
    }
    with pytest.raises(SystemExit):
        ab.apply_set(config, "no-equals-sign")
    config = {"channels": [{"name": "fake", "base_url": "http://u:1/v1"}]}
    ab.apply_set(config, 'channels.0.replicas=["{upstream}/v1"]', "http://u:1")
    ab.apply_set(config, "channels.0.routing.policy=precise")
    assert config["channels"] == [
        {
            "name": "fake",
            "base_url": "http://u:1/v1",
            "replicas": ["http://u:1/v1"],
            "routing": {"policy": "precise"},
        }  # fmt: skip
    ]


def test_two_settings_side_by_side() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH / "overhead_ab.py"),
            "--set-b",
            "server.busy_poll_us=0",
            "--rounds",
            "1",
            "--seconds",
            "0.3",
            "--cases",
            "chat/json,messages/stream",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]  # what went wrong, not just the status
    summary = json.loads(out.stdout)
    assert summary["b"]["set"] == ["server.busy_poll_us=0"]
    assert set(summary["cases"]) == {"chat/json/c1", "messages/stream/c1"}
    for label, row in summary["cases"].items():
        for side in ("A", "B"):
            assert row[side]["errors"] == 0, (label, side)
            assert row[side]["rps"] > 0
            assert row[side]["added_p50_ms"] is not None
        assert (row["A"]["added_ttft_ms"] is None) == label.startswith("chat/json")
