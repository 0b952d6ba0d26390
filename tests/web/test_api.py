"""The dashboard's JSON API over loopback, on the demo's incident store."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

from prefixgate.gateway import NullRecorder
from prefixgate.store import open_store
from tests.web.conftest import SPARE_REPLICA


def get(base: str, path: str, **params) -> dict:
    r = httpx.get(f"{base}/dashboard/api/{path}", params={"since": "all", **params}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def records(dsn: str):
    with open_store(dsn) as store:
        return list(store.iter_records())


def test_overview_splits_the_hit_rate_by_entry(dashboard, demo_stores):
    recs = records(demo_stores.incident)
    o = get(dashboard, "overview")
    t = o["totals"]
    assert t["requests"] == len(recs) and t["errors"] == 0
    assert t["prompt_tokens"] == sum(r.prompt_tokens for r in recs)
    assert t["cached_tokens"] == sum(r.cached_tokens or 0 for r in recs)
    assert t["ttft"]["p50"] <= t["ttft"]["p90"] <= t["ttft"]["p99"]
    series = o["series"]
    assert len(series["t"]) == series["buckets"] == len(series["ttft"])
    groups = {g["name"]: g for g in series["groups"]}
    assert set(groups) == {"messages", "chat"}
    for name, g in groups.items():
        mine = [r for r in recs if r.endpoint == name]
        points = [p for p in g["points"] if p]
        assert sum(p["requests"] for p in points) == len(mine)
        assert sum(p["cached_tokens"] for p in points) == sum(r.cached_tokens or 0 for r in mine)
    # The incident at a glance: Claude Code's entry hits less than the control group's.
    by_entry = {s["value"]: s for s in o["slices"]["endpoint"]}
    assert by_entry["messages"]["hit_rate"] < by_entry["chat"]["hit_rate"] - 0.1
    assert {s["value"] for s in o["slices"]["client"]} == {"claude-cli", "opencode"}


def test_overview_by_client_and_an_empty_window(dashboard):
    o = get(dashboard, "overview", by="client")
    assert {g["name"] for g in o["series"]["groups"]} == {"claude-cli", "opencode"}
    empty = get(dashboard, "overview", since="2001-01-01", until="2001-01-02")
    assert empty["totals"]["requests"] == 0 and empty["series"] is None


def test_distribution_marks_the_pinned_constant(dashboard, demo_stores):
    recs = [r for r in records(demo_stores.incident) if r.endpoint == "messages"]
    value, count = Counter(r.cached_tokens for r in recs if r.cached_tokens).most_common(1)[0]
    d = get(dashboard, "distribution")
    assert d["block"]["block"] == 64
    slices = {s["value"]: s for s in d["slices"]}
    m, c = slices["messages"], slices["chat"]
    assert m["pinned"]["value"] == value and m["pinned"]["requests"] == count
    assert m["pinned_expression"] == f"{value} = {value // 64} × 64"
    assert c["pinned"] is None
    # The histogram counts every request once, and the spike holds the pinned ones.
    assert sum(m["cached_bins"]) == sum(m["prompt_bins"]) == m["requests"] == len(recs)
    assert m["cached_bins"][value // d["width"]] >= count
    assert max(m["cached_bins"]) == m["cached_bins"][value // d["width"]]


def test_the_fix_has_no_pinned_constant(demo_stores, tmp_path):
    from prefixgate.serve.process import ServerThread
    from tests.web.conftest import dashboard_app

    with ServerThread(dashboard_app(demo_stores.fixed, demo_stores.replica)) as srv:
        d = get(srv.url, "distribution")
    assert all(s["pinned"] is None for s in d["slices"])


def test_filters_narrow_every_view(dashboard, demo_stores):
    recs = records(demo_stores.incident)
    opencode = [r for r in recs if r.client == "opencode"]
    o = get(dashboard, "overview", client="opencode")
    assert o["totals"]["requests"] == len(opencode)
    assert [s["value"] for s in o["slices"]["endpoint"]] == ["chat"]
    log = get(dashboard, "requests", client="opencode", limit=500)
    assert len(log["rows"]) == len(opencode)
    assert {r["client"] for r in log["rows"]} == {"opencode"}
    session = opencode[0].session_id
    log = get(dashboard, "requests", session=session)
    assert {r["session_id"] for r in log["rows"]} == {session}
    assert len(log["rows"]) == sum(r.session_id == session for r in recs)
    assert get(dashboard, "requests", model="no-such-model")["rows"] == []
    meta = get(dashboard, "meta")
    assert {v["value"] for v in meta["values"]["endpoint"]} == {"messages", "chat"}
    assert meta["window"]["requests"] == len(recs)


def test_request_log_pages_newest_first(dashboard, demo_stores):
    total = len(records(demo_stores.incident))
    seen, cursor, pages = [], None, 0
    while True:
        page = get(dashboard, "requests", limit=10, **({"before": cursor} if cursor else {}))
        seen += page["rows"]
        pages += 1
        cursor = page["next"]
        if cursor is None:
            break
    assert pages == -(-total // 10)
    assert len({r["request_id"] for r in seen}) == total
    times = [r["received_at"] for r in seen]
    assert times == sorted(times, reverse=True)


def test_request_view_shows_where_the_prefix_changed(dashboard, demo_stores):
    recs = records(demo_stores.incident)
    sessions = Counter(r.session_id for r in recs if r.endpoint == "messages")
    session = next(s for s, n in sessions.items() if n >= 3)
    third = [r for r in recs if r.session_id == session][2]
    v = get(dashboard, f"requests/{third.request_id}")
    assert v["session_position"] == 3 and v["previous"] and v["next"]
    assert [s["hash"] for s in v["segments_out"]] == [s.hash for s in third.segments_out]
    change = v["changed_out"]
    seg = v["segments_out"][change["index"]]
    # The billing header's per-request cch= makes the system prompt differ: after the tools.
    assert seg["kind"] == "system" and v["segments_out"][0]["kind"] == "tools"
    assert change["offset"] >= v["segments_out"][0]["tokens"]
    assert v["captured"]
    # what changed, found at capture time: its class and shape, never its text
    c = v["change"]
    assert (c["cls"], c["segment"], c["known"]) == ("nonce", "system[0]", "billing_header")
    assert c["shape"]["new_skeleton"] in ("<hex:5>", "99999") and c["lost_tokens"] > 0
    texts = get(dashboard, "texts", h=[seg["hash"], change["prev_hash"]])["texts"]
    assert "cch=" in texts[seg["hash"]] and texts[seg["hash"]] != texts[change["prev_hash"]]
    # The control group only grows: no segment of the previous request changes.
    chat_session = next(r.session_id for r in recs if r.endpoint == "chat")
    second = [r for r in recs if r.session_id == chat_session][1]
    w = get(dashboard, f"requests/{second.request_id}")
    assert w["changed_out"]["index"] is None


def test_doctor_returns_findings_with_evidence_and_fix(dashboard):
    d = get(dashboard, "doctor")
    kinds = {f["kind"]: f for f in d["findings"]}
    broken = kinds["prefix_broken"]
    assert broken["severity"] == "critical"
    assert any("strip_anthropic_billing_header" in line for line in broken["fix"])
    assert {"slice vs control", "cached_tokens distribution"} <= {
        t["title"] for t in broken["evidence"]
    }
    assert kinds["l2_write_only"]["severity"] == "warning"  # from the channel's metrics_url


def test_upstream_shows_replicas_errors_and_the_host_tier(dashboard, demo_stores):
    u = get(dashboard, "upstream")
    [ch] = u["channels"]
    assert ch["name"] == "h200-vllm" and ch["routing"] == "session"
    reps = {r["url"]: r for r in ch["replicas"]}
    assert set(reps) == {demo_stores.replica, SPARE_REPLICA}
    assert reps[demo_stores.replica]["stats"]["requests"] == len(records(demo_stores.incident))
    assert reps[demo_stores.replica]["state"] == "up"
    assert reps[SPARE_REPLICA]["stats"] is None
    assert ch["l2"]["status"] == "write_only"
    assert ch["l2"]["counters"]["load_bytes"] == 0 and ch["l2"]["finding"]["fix"]
    assert u["errors"] == []
    # Admission of the worker that answered: nothing in flight but this look, no cap per
    # channel here.
    assert u["admission"]["limit"] == 2000 and u["admission"]["queued"] == 0
    assert u["admission"]["refused"] == 0
    assert u["admission"]["shed"] == 0 and u["admission"]["shedding"] is False
    assert ch["admission"] is None


@pytest.mark.parametrize(
    ("path", "params"),
    [("overview", {"since": "yesterday-ish"}), ("overview", {"by": "colour"}), ("texts", {})],
)
def test_bad_parameters_are_400(dashboard, path, params):
    r = httpx.get(f"{dashboard}/dashboard/api/{path}", params=params)
    assert r.status_code == 400 and r.json()["error"]


def test_unknown_request_is_404(dashboard):
    r = httpx.get(f"{dashboard}/dashboard/api/requests/nope")
    assert r.status_code == 404


def test_pages_and_static_files(dashboard):
    for path in ("", "/distribution", "/doctor", "/upstream", "/requests", "/requests/x"):
        r = httpx.get(f"{dashboard}/dashboard{path}")
        assert r.status_code == 200 and "<title>" in r.text
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert "https://" not in r.text  # nothing from a CDN
    for name, kind in (
        ("app.js", "javascript"),
        ("charts.js", "javascript"),
        ("dashboard.css", "css"),
    ):
        r = httpx.get(f"{dashboard}/dashboard/static/{name}")
        assert r.status_code == 200 and kind in r.headers["content-type"]
        assert "https://" not in r.text
    assert httpx.get(f"{dashboard}/dashboard/static/../server.py").status_code == 404
    assert httpx.get(f"{dashboard}/dashboard/static/nope.js").status_code == 404


def test_a_failed_request_shows_its_reason(tmp_path):
    from prefixgate.record.record import Record
    from prefixgate.web.queries import request_detail

    with open_store(f"sqlite:///{tmp_path / 'f.db'}") as store:
        store.migrate()
        store.write_batch(
            [
                Record(
                    request_id="failed-1",
                    received_at=1.0,
                    endpoint="messages",
                    status=400,
                    error_type="invalid_request_error",
                    error_message="prompt is too long: 102001 tokens > 16384 maximum",
                )
            ]
        )
        v = request_detail(store, "failed-1")
    assert v["error_message"] == "prompt is too long: 102001 tokens > 16384 maximum"
    assert v["change"] is None


def test_usage_groups_cost_by_owner(tmp_path):
    from prefixgate.config import parse_config
    from prefixgate.record import Record
    from prefixgate.serve.app import create_app
    from prefixgate.serve.process import ServerThread
    from prefixgate.spend.prices import PriceTable

    prices = {"models": {"m": {"input": 1.0, "cached_input": 0.1, "output": 4.0}}}
    config = parse_config(
        {
            "channels": [{"name": "c", "base_url": "http://127.0.0.1:9/v1", "models": ["m"]}],
            "store": {"dsn": f"sqlite:///{tmp_path}/u.db", "journal_path": str(tmp_path / "j")},
            "prices": prices,
        }
    )
    table = PriceTable.from_config(config.prices)
    recs = []
    for i, (key, owner) in enumerate([("a", "t1"), ("b", "t1"), ("c", "t2")]):
        r = Record(request_id=f"r{i}", received_at=1e9 + i, key_name=key, key_owner=owner)
        r.requested_model, r.channel, r.status, r.endpoint = "m", "c", 200, "chat"
        r.prompt_tokens, r.cached_tokens, r.completion_tokens = 1000, 500 * i, 10
        table.charge(r)
        recs.append(r)
    with open_store(config.store.dsn) as store:
        store.migrate()
        store.write_batch(recs)
    with ServerThread(create_app(config, recorder=NullRecorder())) as srv:
        d = get(srv.url, "usage", by="owner")
        bad = httpx.get(f"{srv.url}/dashboard/api/usage", params={"by": "colour"})
    rows = {r["group"]: r for r in d["rows"]}
    assert rows["t1"]["requests"] == 2 and rows["t2"]["requests"] == 1
    assert rows["t1"]["cost_nano"] == recs[0].cost_nano + recs[1].cost_nano
    assert d["total"]["saved_nano"] == sum(r.cost_saved_nano for r in recs)
    assert d["currency"] == "USD"
    assert bad.status_code == 400 and "cannot group by 'colour'" in bad.json()["error"]


def test_every_demo_request_has_a_ledger(dashboard, demo_stores):
    """The demo's gateway has no engine events: its ledgers come from the cache model."""
    recs = records(demo_stores.incident)
    for r in recs:
        ledger = get(dashboard, f"requests/{r.request_id}")["ledger"]
        assert ledger["source"] == "model"
        assert sum(ledger["parts"].values()) == r.prompt_tokens
        assert ledger["hit"] == (r.cached_tokens or 0)
    changed = [
        get(dashboard, f"requests/{r.request_id}")["ledger"]
        for r in recs
        if r.endpoint == "messages"
    ]
    # Claude Code's billing header changes the system prompt every turn
    assert sum(x["prefix_changed"] for x in changed) > 0
    assert {x["changed_segment"] for x in changed if x["prefix_changed"]} == {"messages[0]:system"}
    o = get(dashboard, "overview")["ledger"]
    assert o["sources"] == {"model": len(recs)}
    assert sum(o["totals"].values()) == sum(r.prompt_tokens for r in recs)
