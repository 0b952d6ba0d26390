"""The seed-l2 scenario: a host tier written and never read under veto."""

from __future__ import annotations

import json

import pytest

from prefixgate.lab.simulate import SCENARIOS, render_text, run_scenario, to_json


@pytest.fixture(scope="module")
def seed_l2():
    return run_scenario("seed-l2")


def test_veto_writes_the_host_and_never_reads_it(seed_l2):
    veto = seed_l2.run("veto").stats
    assert veto.host_stores > 1000
    assert veto.host_loads == 0
    assert veto.host_hit_tokens == 0
    assert veto.external_hit_rate == 0.0
    assert veto.gpu_evicted_blocks > 0  # the GPU tier is too small for the working set


def test_promote_serves_the_host_tier(seed_l2):
    veto, promote = seed_l2.run("veto").stats, seed_l2.run("promote").stats
    assert promote.host_loads > 0
    assert promote.host_hit_tokens > 0
    assert promote.recompute_tokens > 0
    assert promote.gpu_hit_tokens == veto.gpu_hit_tokens
    assert promote.computed_tokens < veto.computed_tokens
    assert promote.prefill_seconds_saved > veto.prefill_seconds_saved


def test_report_shows_both_side_by_side(seed_l2):
    text = render_text(seed_l2)
    assert "Scenario: seed-l2" in text
    assert "veto" in text and "promote" in text
    assert "External hit rate" in text and "0.0%" in text
    doc = json.loads(to_json(seed_l2))
    assert [r["label"] for r in doc["runs"]] == ["veto", "promote"]
    assert doc["runs"][0]["aggregate"]["host_loads"] == 0


def test_unknown_scenario():
    assert "seed-l2" in SCENARIOS
    with pytest.raises(ValueError):
        run_scenario("nope")
