"""Absolute detection end to end: Claude-Code-like sessions with one known breaker each,
through the real gateway over loopback into a simulated vLLM, recorded in a real store;
no other traffic to compare with. The doctor must name each breaker by its class and
segment, and find nothing critical in the control."""

from __future__ import annotations

import pytest

from prefixgate.doctor import breakers as brk
from prefixgate.doctor import diagnose, exit_code, render_text
from prefixgate.lab.traffic import breakers as bk
from prefixgate.store import open_store
from tests.conftest import pg_schema_dsn
from tests.doctor import live


def record(case: str, dsn: str, **kw) -> str:
    return live.record(case, dsn, **kw)[0]


def named(d, case):
    want = bk.EXPECTED[case]
    return [
        f
        for f in d.findings
        if (b := f.facts.get("breaker"))
        and (b["class"], b["segment"], b["scope"]) == (want.cls, want.segment, want.scope)
    ]


@pytest.mark.parametrize("case", [c for c in bk.CASES if c != bk.CONTROL])
def test_each_breaker_is_named_without_a_peer(tmp_path, case):
    d = diagnose(record(case, f"sqlite:///{tmp_path / 'case.db'}"))
    [f] = named(d, case)
    b = f.facts["breaker"]
    assert b["client"] == "claude-cli" and b["channel"] == "vllm"
    assert b["lost_tokens"] > 0 and b["shape"]["cls"] == bk.EXPECTED[case].cls
    assert f.fix and f.facts["prediction"]["predicted_rate"] > 0.8
    if b["scope"] == "session":
        assert f.kind == "prefix_broken" and b["breaks"] >= 8  # 3 sessions × 4 later turns
        assert f.facts["prediction"]["predicted_rate"] > f.facts["prediction"]["measured_rate"]
    else:
        assert f.kind == "per_session_prefix" and b["breaks"] == 2  # the 2nd and 3rd opening
    assert "no_problem" not in [x.kind for x in d.findings]


def test_the_control_has_no_critical_finding(tmp_path):
    d = diagnose(record(bk.CONTROL, f"sqlite:///{tmp_path / 'control.db'}"))
    assert exit_code(d) == 0
    assert not [f for f in d.findings if f.facts.get("breaker")]
    assert d.breakers == []


def test_the_clock_in_words(tmp_path):
    d = diagnose(record(bk.CLOCK, f"sqlite:///{tmp_path / 'clock.db'}", order="system_first"))
    [f] = named(d, bk.CLOCK)
    assert f.severity == "critical" and exit_code(d) == 2
    assert (
        "a time of day (99:99:99) after the first paragraph of system block 1 (line 4, char 202"
        in f.title
    )
    assert "changes on every request" in f.title
    text = " ".join(render_text(d).split())  # as read, not as wrapped
    assert "12 of 12 consecutive requests, 3 sessions" in text
    assert "Current time" not in text  # the shape, never the text
    assert any("put it in the latest user message" in x for x in f.fix)


def test_materiality_is_configurable(tmp_path):
    dsn = record(bk.MID_DATE, f"sqlite:///{tmp_path / 'date.db'}")
    assert named(diagnose(dsn), bk.MID_DATE)
    quiet = diagnose(dsn, min_loss_share=0.99, min_loss_per_day=1e12)
    assert not named(quiet, bk.MID_DATE)
    assert quiet.breakers and quiet.breakers[0]["class"] == "date"  # still listed


def test_on_postgres_the_same(pg_database):
    dsn = record(bk.TOOLS_REORDERED, pg_schema_dsn(pg_database))
    d = diagnose(dsn)
    [f] = named(d, bk.TOOLS_REORDERED)
    assert f.facts["breaker"]["shape"]["detail"] == "20 tools, same set, other order"
    with open_store(dsn) as store:
        rows = store.query(
            "SELECT COUNT(*), SUM(prompt_tokens * change_lost) FROM requests"
            " WHERE change_class = 'reordered_list' AND compared = 'session'"
        )
    assert rows[0][0] == f.facts["breaker"]["breaks"]
    assert round(float(rows[0][1])) == pytest.approx(f.facts["breaker"]["lost_tokens"], abs=2)


def test_words():
    assert brk.segment_name("system[1]") == "system block 1"
    assert brk.segment_name("messages[1]:system") == (
        "the mid-conversation system message (messages[1])"
    )
    assert brk.segment_name("tools") == "the tool list"
    assert brk.segment_name("Edit") == "tool Edit's definition"
