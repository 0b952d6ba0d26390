"""The demo's store: phase 1 is the billing-header incident, phase 2 the fix, measured for real."""

import contextlib

import pytest

from prefixgate.doctor import diagnose, exit_code, render_text
from prefixgate.lab.incident import run_demo


@contextlib.contextmanager
def no_progress(name, total):
    yield lambda: None


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    path = tmp_path_factory.mktemp("demo") / "demo.db"
    results = run_demo(sessions=6, turns=12, store_path=str(path), progress_factory=no_progress)
    return results


def test_doctor_names_the_incident(demo):
    results = demo
    d = diagnose(results[0].dsn)
    [f] = [f for f in d.findings if f.kind == "prefix_broken"]
    assert f.severity == "critical" and exit_code(d) == 2
    assert f.facts["slice"]["slice"] == "endpoint=messages"
    assert f.facts["channel"] == "h200-vllm"
    # the constant: k × 64, the tools' block-aligned length, as the demo measured it
    pinned = f.facts["distribution"]["pinned"]
    assert f.facts["block_size"] == 64 and pinned["block"] == 64
    assert pinned["value"] == pinned["k"] * 64 == results[0].entries["messages"].pinned_value
    assert f.facts["offset_matches_constant"]
    # the segment: system[0], the billing header, and what varies inside it
    seg = f.facts["segments"]
    assert seg["in_segment"] == "system[0]" and seg["cause"] == "billing_header"
    assert any("what varies:" in line and "cch=" in line for line in f.summary)
    assert seg["volatility"] == "per-request"
    assert any("strip_anthropic_billing_header" in x and "h200-vllm" in x for x in f.fix)
    # the prediction lands within 5 points of what the fix really measured
    measured_after = results[1].entries["messages"].hit_rate
    assert abs(f.facts["prediction"]["predicted_rate"] - measured_after) < 0.05
    assert abs(f.facts["prediction"]["calibration_points"]) < 5
    assert f.facts["control"]["slice"] == "endpoint=chat"
    assert "endpoint=messages" in render_text(d)


def test_after_the_fix_nothing_is_critical(demo):
    d = diagnose(demo[1].dsn)
    assert exit_code(d) == 0
    assert not [f for f in d.findings if f.kind == "prefix_broken"]
