"""Errors are findings: floods of failed requests through the real gateway, each named
with its cause and the fix on the side that can make it."""

from __future__ import annotations

from prefixgate.config import hash_key
from prefixgate.doctor import diagnose, exit_code
from prefixgate.doctor.failures import kind_of
from prefixgate.lab.traffic import breakers as bk
from tests.doctor import live


def kinds(d, kind):
    return [f for f in d.findings if f.kind == kind]


def test_context_overflow_names_both_windows_and_both_fixes(tmp_path):
    # Claude Code's tools alone are ~18k tokens: the window is outgrown within a session.
    dsn, statuses = live.record(
        bk.CONTROL,
        f"sqlite:///{tmp_path / 'o.db'}",
        sim={"max_model_len": 24_000},
        sessions=2,
        turns=8,
        ok_only=False,
    )
    assert 200 in statuses and 400 in statuses
    d = diagnose(dsn)
    [f] = kinds(d, "context_overflow")
    assert f.facts["max_model_len"] == 24_000 and f.facts["client"] == "claude-cli"
    assert f.facts["failed"] == statuses.count(400)
    assert f.facts["refused_estimated"]["max"] > 24_000 >= f.facts["largest_served"] > 0
    assert "window (max_model_len) is 24.0k" in f.title
    assert any("--max-model-len" in x for x in f.fix)
    assert any("CLAUDE_CODE_MAX_CONTEXT_TOKENS=24000" in x for x in f.fix)
    assert f.severity == ("critical" if f.facts["share"] >= 0.2 else "warning")
    assert "no_problem" not in [x.kind for x in d.findings]


def test_an_unknown_model(tmp_path):
    dsn, statuses = live.record(
        bk.CONTROL, f"sqlite:///{tmp_path / 'm.db'}", model="claude-haiku-4-5", ok_only=False
    )
    assert set(statuses) == {404}
    d = diagnose(dsn)
    [f] = kinds(d, "unknown_model")
    assert "'claude-haiku-4-5'" in f.title and exit_code(d) == 2
    assert any("model_map" in x for x in f.fix)


def test_an_unreachable_upstream(tmp_path):
    dsn, statuses = live.record(
        bk.CONTROL,
        f"sqlite:///{tmp_path / 'u.db'}",
        channel={"base_url": "http://127.0.0.1:9/v1"},  # nothing listens there
        ok_only=False,
    )
    assert set(statuses) == {502}
    [f] = kinds(diagnose(dsn), "upstream_unreachable")
    assert f.facts["share"] == 1.0 and f.severity == "critical"
    assert any("cannot reach upstream" in reason for reason in f.facts["reasons"])


def test_rate_limited_by_the_keys_own_limits(tmp_path):
    key = {"name": "team", "key_sha256": hash_key("sim-key"), "max_concurrency": 1}
    dsn, statuses = live.record(
        bk.CONTROL,
        f"sqlite:///{tmp_path / 'r.db'}",
        config={"keys": [key]},
        sessions=4,
        turns=3,
        ok_only=False,
    )
    assert 429 in statuses
    [f] = kinds(diagnose(dsn), "rate_limited")
    assert "the gateway's per-key limits" in f.title


def test_kinds_from_what_a_record_says():
    assert (
        kind_of(400, "invalid_request_error", "prompt is too long: 16385 tokens > 16384 maximum")
        == "context_overflow"
    )
    assert kind_of(404, "not_found_error", "model 'x' is not served here") == "unknown_model"
    assert (
        kind_of(502, "api_error", "cannot reach upstream: ECONNREFUSED: Connection refused")
        == "upstream_unreachable"
    )
    assert kind_of(429, "rate_limit_error", "upstream rate limit: slow down") == "rate_limited"
    assert kind_of(400, "invalid_request_error", "messages: at least one message") == "errors"
