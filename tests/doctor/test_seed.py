"""The billing-header incident from hand-made records: the whole diagnosis, on SQLite and Postgres."""

import json

import pytest

from prefixgate.doctor import diagnose, exit_code, render_text, slices, to_json
from prefixgate.doctor import distribution as dist
from prefixgate.store import open_store
from tests.conftest import pg_schema_dsn
from tests.doctor import builders as b
from tests.doctor.conftest import seed_records


def the_finding(d, kind="prefix_broken"):
    found = [f for f in d.findings if f.kind == kind]
    assert len(found) == 1, [f.title for f in d.findings]
    return found[0]


def test_seed_diagnosis(seed_dsn):
    d = diagnose(seed_dsn)
    f = the_finding(d)
    assert f.severity == "critical" and exit_code(d) == 2
    s = f.facts["slice"]
    assert s["slice"] == "endpoint=messages" and s["channel"] == b.CHANNEL
    assert "client=claude-cli" in s["aliases"]
    assert 0.140 <= s["hit_rate"] <= 0.146
    # the distribution: pinned at 17920 = 280 × 64, and that is the whole rate
    p = f.facts["distribution"]["pinned"]
    assert (p["value"], p["k"], p["block"], p["requests"]) == (17920, 280, 64, 383)
    assert p["explains"] and abs(p["explained_rate"] - s["hit_rate"]) < 0.002
    assert f.facts["block_size"] == 64
    # the segment: system[0] billing header, per request, at the constant, with the diff
    seg = f.facts["segments"]
    assert seg["cause"] == "billing_header"
    assert seg["in_segment"] == "system[0]"
    assert seg["first_unstable"] == "messages[0]:system"
    assert seg["volatility"] == "per-request"
    assert f.facts["offset_matches_constant"]
    assert seg["diffs"] and all(x.startswith("cch=") and " → " in x for x in seg["diffs"])
    # the fix, its prediction, and the control group
    assert any("strip_anthropic_billing_header" in x and b.CHANNEL in x for x in f.fix)
    assert any("CLAUDE_CODE_ATTRIBUTION_HEADER=0" in x for x in f.fix)
    pred = f.facts["prediction"]
    assert abs(pred["calibration_points"]) < 5
    assert pred["predicted_rate"] > 0.6
    assert f.facts["control"]["slice"] == "endpoint=chat"
    assert f.facts["control"]["hit_rate"] > 0.8


def test_seed_report_reads_top_down(seed_dsn):
    d = diagnose(seed_dsn)
    text = render_text(d)
    first = text.index("[CRITICAL]")
    assert first < text.index("17920 = 280 × 64") < text.index("Slices ranked")
    assert "cch=" in text and "strip_anthropic_billing_header" in text
    assert "control: endpoint=chat" in text
    data = json.loads(to_json(d))
    assert data["findings"][0]["kind"] == "prefix_broken"
    assert data["overall"]["requests"] == 895


def test_window_limits_the_records(seed_dsn):
    d = diagnose(seed_dsn, since=b.T0 + 86400)
    assert d.overall["requests"] == 0
    assert [f.kind for f in d.findings] == ["no_problem"]
    assert exit_code(d) == 0


def test_empty_store(tmp_path):
    d = diagnose(f"sqlite:///{tmp_path / 'none.db'}")
    assert d.notes and exit_code(d) == 0


def _aggregates(dsn):
    with open_store(dsn) as store:
        cells = sorted(slices.load_cells(store, None, None), key=repr)
        groups = dist.load(store, [("channel", b.CHANNEL), ("endpoint", "messages")])
        values = dist.cached_values(store, [("channel", b.CHANNEL)])
    return cells, groups, values


@pytest.mark.postgres
def test_same_sql_on_postgres(tmp_path, pg_database):
    records = seed_records()
    lite = b.write(f"sqlite:///{tmp_path / 'lite.db'}", records)
    pg = b.write(pg_schema_dsn(pg_database), seed_records())
    cells_l, groups_l, values_l = _aggregates(lite)
    cells_p, groups_p, values_p = _aggregates(pg)
    assert cells_l == cells_p
    assert groups_l == groups_p
    assert values_l == values_p
    assert {c.day for c in cells_p} == {int(b.T0 // 86400)}


@pytest.mark.postgres
def test_diagnosis_on_postgres(pg_database):
    dsn = b.write(pg_schema_dsn(pg_database), seed_records())
    d = diagnose(dsn)
    f = the_finding(d)
    assert f.facts["segments"]["cause"] == "billing_header"
    assert f.facts["distribution"]["pinned"]["value"] == 17920
    assert "password" not in d.store


def test_day_boundaries_are_floors(tmp_path):
    # requests one second either side of midnight fall on different days, in both dialects
    recs = b.simulate(b.chat_sessions(2, 2, start=b.T0 - 1.5))
    dsn = b.write(f"sqlite:///{tmp_path / 'days.db'}", recs)
    with open_store(dsn) as store:
        days = {c.day for c in slices.load_cells(store, None, None)}
    assert days == {int(b.T0 // 86400) - 1, int(b.T0 // 86400)}


@pytest.mark.postgres
def test_day_boundaries_on_postgres(pg_database):
    recs = b.simulate(b.chat_sessions(2, 2, start=b.T0 - 1.5))
    dsn = b.write(pg_schema_dsn(pg_database), recs)
    with open_store(dsn) as store:
        days = {c.day for c in slices.load_cells(store, None, None)}
    assert days == {int(b.T0 // 86400) - 1, int(b.T0 // 86400)}
