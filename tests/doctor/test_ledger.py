"""The doctor reads the miss ledgers: capacity, routing and the host tier as separate
findings with their figures, and the calibration line. Records and ledgers are written
into a real SQLite store, the doctor reads it as ``prefixgate doctor`` does."""

from __future__ import annotations

from prefixgate.doctor import diagnose, render_text
from prefixgate.ledger import Ledger
from prefixgate.record import Record
from prefixgate.store import open_store

from .test_upstream_health import snapshot

_NOT_CAUSES = ("host", "pred", "at", "cleared")  # figures beside the causes


def write(
    dsn: str,
    rows: list[tuple[str, str, dict]],
    source: str = "events",
    changed=None,
    key: str | None = None,
) -> None:
    """(channel, replica, ledger parts and figures) per request; ``changed(i)``: the i-th
    ledger's changed segment; ``key``: the key that sent them."""
    records, ledgers = [], []
    for i, (channel, replica, parts) in enumerate(rows):
        rid = f"{key or 'r'}-{channel}-{i:04d}"
        prompt = sum(v for k, v in parts.items() if not k.startswith(_NOT_CAUSES))
        cached = parts.get("hit", 0)
        records.append(
            Record(
                request_id=rid,
                received_at=1000.0 + i,
                endpoint="chat",
                channel=channel,
                replica=replica,
                status=200,
                prompt_tokens=prompt,
                cached_tokens=cached,
                session_id=f"s{i % 4}",
                key_name=key,
            )
        )
        ledgers.append(
            Ledger(
                request_id=rid,
                received_at=1000.0 + i,
                source=source,
                prompt_tokens=prompt,
                block_size=16,
                **{k: v for k, v in parts.items() if not k.startswith(_NOT_CAUSES)},
                elsewhere_replica="http://b/v1" if parts.get("elsewhere") else None,
                engine_cached=cached,
                index_predicted=parts.get("pred", cached),
                model_predicted=cached + 16 * (i % 2),
                host_hit=parts.get("host_hit", 0),
                host_missed=parts.get("host_missed", 0),
                cleared=parts.get("cleared", 0),
                changed_segment=changed(i) if changed else None,
            )
        )
    with open_store(dsn) as store:
        store.migrate()
        store.write_batch(records)
        store.write_ledgers(ledgers)
        store.write_ledgers(ledgers)  # written twice: stored once


def test_capacity_routing_and_calibration_are_separate_findings(tmp_path) -> None:
    dsn = f"sqlite:///{tmp_path / 'l.db'}"
    rows = [("evicting", "http://a/v1", {"hit": 600, "evicted": 380, "partial_block": 20})] * 10
    rows += [("spread", "http://a/v1", {"hit": 500, "elsewhere": 480, "partial_block": 20})] * 9
    rows += [("spread", "http://a/v1", {"hit": 900, "cold": 80, "partial_block": 20, "pred": 0})]
    write(dsn, rows)
    d = diagnose(dsn, policies={"spread": "round_robin", "evicting": "session"})
    by_kind = {f.kind: f for f in d.findings}
    cap, route, cal = by_kind["kv_capacity"], by_kind["routing_loss"], by_kind["calibration"]
    assert cap.facts["channel"] == "evicting" and cap.facts["evicted_tokens"] == 3800
    assert cap.severity == "critical" and "host tier" in " ".join(cap.fix)
    assert route.facts["channel"] == "spread" and route.facts["elsewhere_tokens"] == 9 * 480
    assert route.facts["policy"] == "round_robin" and route.facts["better_policy"] == "session"
    assert route.evidence[0].rows[0][:3] == ["http://a/v1", "http://b/v1", 9]
    assert cal.facts["index_agree"] == 19 and cal.facts["index_requests"] == 20
    assert cal.facts["model_agree"] == 10
    assert "95.0% of 20 requests" in cal.title and "no_problem" not in by_kind
    text = render_text(d)
    assert "recomputed because the engine had evicted them" in text and "calibration" in text


def test_the_host_tiers_real_contents_replace_the_guess(tmp_path) -> None:
    dsn = f"sqlite:///{tmp_path / 'h.db'}"
    rows = [
        ("l2", "http://a/v1", {"hit": 64, "evicted": 900, "partial_block": 4, "host_missed": 900})
    ]
    write(dsn, rows * 5)
    guess = [("h:8000", snapshot(2.6e10, 0, 7e5, 0))]
    d = diagnose(dsn, metrics_snapshots=guess)
    [f] = [f for f in d.findings if f.kind == "l2_write_only"]
    assert f.facts == {"channel": "l2", "host_missed_tokens": 4500, "host_hit_tokens": 0}
    assert any("engines' KV events" in n for n in d.notes)
    # a host tier that serves: no finding, the guess is left out all the same
    write(dsn, [("l2", "http://a/v1", {"hit": 64, "partial_block": 4, "host_hit": 64})] * 50)
    d = diagnose(dsn, metrics_snapshots=guess, since=1000.0)
    assert not [f for f in d.findings if f.kind == "l2_write_only"]


def test_no_ledgers_no_findings(tmp_path) -> None:
    dsn = f"sqlite:///{tmp_path / 'n.db'}"
    write(dsn, [])
    assert [f.kind for f in diagnose(dsn).findings] == ["no_problem"]


def test_no_capacity_finding_without_eviction_evidence(tmp_path) -> None:
    """Ledgers from the cache model (no KV events): an eviction they book, from a store
    written before the model stopped booking them, is no evidence of one."""
    dsn = f"sqlite:///{tmp_path / 'm.db'}"
    write(dsn, [("model", "http://a/v1", {"hit": 600, "evicted": 380, "partial_block": 20})] * 10,
          source="model")  # fmt: skip
    kinds = {f.kind for f in diagnose(dsn).findings}
    assert "kv_capacity" not in kinds


def test_a_cache_clear_is_no_capacity_finding(tmp_path) -> None:
    """Tokens lost to the engine clearing its cache (a flush, a restart) are their own
    finding, with their own fix; only the evictions that were not clears count as capacity."""
    dsn = f"sqlite:///{tmp_path / 'c.db'}"
    flushed = {"hit": 600, "evicted": 380, "cleared": 380, "partial_block": 20}
    write(dsn, [("flushed", "http://a/v1", flushed)] * 10)
    by_kind = {f.kind: f for f in diagnose(dsn).findings}
    assert "kv_capacity" not in by_kind
    f = by_kind["cache_cleared"]
    assert f.facts == {"channel": "flushed", "cleared_tokens": 3800, "share": 0.38}
    assert f.severity == "warning" and "flush_cache" in " ".join(f.fix)
    assert "KV memory" not in " ".join(f.fix)
    assert f.evidence[0].rows[1:3] == [
        ["evicted", "3,800", "38.00%"],
        ["evicted of which cleared", "3,800", "38.00%"],
    ]
    # the same channel with evictions beside the clears: capacity counts only those
    mixed = {"hit": 600, "evicted": 380, "cleared": 80, "partial_block": 20}
    dsn = f"sqlite:///{tmp_path / 'm.db'}"
    write(dsn, [("mixed", "http://a/v1", mixed)] * 10)
    by_kind = {f.kind: f for f in diagnose(dsn).findings}
    assert by_kind["kv_capacity"].facts["evicted_tokens"] == 3000
    assert by_kind["cache_cleared"].severity == "info"


def test_the_templates_findings_name_the_moved_segment_and_the_loss(tmp_path) -> None:
    dsn = f"sqlite:///{tmp_path / 't.db'}"
    write(dsn, [("hoists", "http://a/v1", {"hit": 100, "prefix_changed": 880, "partial_block": 20})]
          * 6, changed=lambda i: f"messages[{3 * i + 2}]:system@head")  # fmt: skip
    d = diagnose(dsn)
    [f] = [f for f in d.findings if f.kind == "template_hoisting"]
    assert f.severity == "critical" and f.facts["recomputed_tokens"] == 6 * 880
    assert f.facts["requests"] == 6 and f.facts["per_request"] == 880
    assert "moves each new system message to the head" in f.title
    assert "kv_capacity" not in {g.kind for g in d.findings}
