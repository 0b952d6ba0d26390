"""The usage report (``prefixgate usage`` and its query) on SQLite and the real Postgres,
and budgets on store keys through ``prefixgate keys``."""

from __future__ import annotations

import csv
import io
import json
import time

import httpx
import pytest
import yaml
from click.testing import CliRunner

from prefixgate.cli import main
from prefixgate.config import parse_config
from prefixgate.record import Record
from prefixgate.record.record import Segment
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.spend.prices import Price, PriceTable
from prefixgate.spend.usage_report import render_csv, render_text, usage_report
from prefixgate.store import open_store
from tests.conftest import pg_schema_dsn

T0 = time.time() - 3600
PRICES = PriceTable("USD", {"m": Price.of(1.0, 0.1, 4.0)}, {})


def _rec(i, key, owner, model="m", client="claude-cli", **over) -> Record:
    r = Record(
        request_id=f"r{i}",
        received_at=T0 + i,
        key_name=key,
        key_owner=owner,
        requested_model=model,
        client=client,
        channel="gpu",
        endpoint="messages",
        status=200,
        prompt_tokens=10_000,
        cached_tokens=8_000,
        completion_tokens=100,
    )
    for k, v in over.items():
        setattr(r, k, v)
    PRICES.charge(r)
    return r


RECORDS = [
    _rec(0, "alice", "team-a"),
    _rec(1, "alice", "team-a", cached_tokens=0),
    _rec(2, "bob", "team-a", client="opencode"),
    _rec(3, "carol", None, model="unpriced"),
    _rec(
        4,
        "bob",
        "team-a",
        status=502,
        prompt_tokens=None,
        cached_tokens=None,
        completion_tokens=None,
    ),
]
ONE = 2_000 * 1_000 + 8_000 * 100 + 100 * 4_000  # nanos: 2,000 fresh, 8,000 cached, 100 out
COLD = 10_000 * 1_000 + 100 * 4_000


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    dsn = (
        f"sqlite:///{tmp_path}/u.db"
        if request.param == "sqlite"
        else pg_schema_dsn(request.getfixturevalue("pg_database"))
    )
    with open_store(dsn) as s:
        s.migrate()
        s.write_batch(RECORDS)
        yield s


def test_the_report_sums_inside_the_database(store):
    rep = usage_report(store, "key", where=" AND received_at >= ?", params=[T0 - 1], prices=PRICES)
    rows = {r.group: r for r in rep.rows}
    assert [r.group for r in rep.rows] == ["alice", "bob", "carol"]  # by cost
    a = rows["alice"]
    assert (a.requests, a.fresh_tokens, a.cached_tokens, a.output_tokens) == (2, 12_000, 8_000, 200)
    assert a.cost_nano == ONE + COLD and a.saved_nano == 8_000 * 900
    assert a.hit_rate == pytest.approx(0.4)
    assert (rows["bob"].requests, rows["bob"].errors, rows["bob"].cost_nano) == (2, 1, ONE)
    assert rows["carol"].cost_nano is None and rows["carol"].unpriced == 1
    assert rep.total.cost_nano == 2 * ONE + COLD and rep.total.requests == 5
    by_owner = {r.group: r for r in usage_report(store, "owner").rows}
    assert by_owner["team-a"].cost_nano == 2 * ONE + COLD and "(none)" in by_owner
    by_client = {r.group: r.requests for r in usage_report(store, "client").rows}
    assert by_client == {"claude-cli": 4, "opencode": 1}
    days = usage_report(store, "day").rows
    assert sum(r.requests for r in days) == 5 and all(len(r.group) == 10 for r in days)
    text = render_text(rep)
    assert "alice" in text and "0.0136" in text and "money in USD" in text
    out = list(csv.reader(io.StringIO(render_csv(rep))))
    assert out[0][8] == "cost_USD" and out[1][8] == "0.013600000"


def test_days_are_listed_in_order(store):
    # two days back, a cheaper day than today's: still listed first
    store.write_batch([_rec(9, "dave", None, received_at=T0 - 2 * 86400)])
    days = usage_report(store, "day", prices=PRICES).rows
    assert [r.group for r in days] == sorted(r.group for r in days) and len(days) >= 2
    assert days[0].requests == 1 and days[0].cost_nano == ONE < days[-1].cost_nano


def _captured(i, session, system0: str, messages: int, tag: str = "", **over) -> Record:
    """A captured Claude Code request: a 100-token first system block (where the billing
    header sits), a 9,000-token system prompt and ``messages`` messages of 450 tokens
    (``tag`` rewrites every one but the first)."""
    segs = [Segment("system", "system[0]", system0, 400, 100)]
    segs.append(Segment("system", "system[1]", "sys", 36_000, 9_000))
    segs += [
        Segment("message", f"messages[{m}]:user", f"m{m}{tag if m else ''}", 1_800, 450)
        for m in range(messages)
    ]
    prompt = sum(x.tokens for x in segs)
    return _rec(
        i,
        "erin",
        "team-b",
        session_id=session,
        segments_in=segs,
        segments_out=segs,
        prompt_tokens=prompt,
        **over,
    )


def test_misses_with_a_known_cause_are_priced_from_the_capture(store):
    # no captured request yet: no cause can be known, nothing is priced as lost
    assert not usage_report(store, "key", prices=PRICES).causes_known
    store.write_batch(
        [
            _captured(20, "s1", "cch=1", 2, cached_tokens=0),
            # the billing header changed (system[0] of a Claude Code request): the previous
            # prompt's 10,000 tokens were all sent again fresh
            _captured(21, "s1", "cch=2", 3, cached_tokens=0),
            # a hit: nothing lost
            _captured(22, "s1", "cch=2", 4, cached_tokens=10_350),
            # another session: its history rewritten inside (no known cause): not counted
            _captured(23, "s2", "cch=9", 2, cached_tokens=0),
            _captured(24, "s2", "cch=9", 3, "edited", cached_tokens=9_100),
        ]
    )
    rep = usage_report(store, "key", prices=PRICES)
    rows = {r.group: r for r in rep.rows}
    assert rep.causes_known
    # 10,000 tokens that cost 1.0 fresh where 0.1 cached would have done
    assert rows["erin"].lost_nano == 10_000 * 900
    assert rows["alice"].lost_nano == 0 and rep.total.lost_nano == 10_000 * 900


def test_usage_command_with_prices_from_the_config(tmp_path, upstream):
    dsn = f"sqlite:///{tmp_path}/g.db"
    cfg = {
        "channels": [{"name": "gpu", "base_url": upstream.url, "models": ["m"]}],
        "store": {"dsn": dsn, "journal_path": str(tmp_path / "j")},
        "prices": {"models": {"m": {"input": 1.0, "cached_input": 0.1, "output": 4.0}}},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with ServerThread(create_app(parse_config(cfg))) as gw:
        for _ in range(3):
            r = httpx.post(
                gw.url + "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                headers={"user-agent": "opencode/1.0"},
            )
            assert r.status_code == 200
    runner = CliRunner()
    r = runner.invoke(main, ["usage", "--config", str(path), "--by", "client", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    [row] = doc["rows"]
    # the scripted upstream: 100 prompt tokens, none cached, 7 out
    assert row["group"] == "opencode" and row["requests"] == 3
    assert row["cost_nano"] == 3 * (100 * 1_000 + 7 * 4_000) and doc["currency"] == "USD"
    r = runner.invoke(main, ["usage", "--store", dsn, "--by", "model", "--csv", "--since", "all"])
    assert r.exit_code == 0 and r.output.splitlines()[1].startswith("m,3,0,300,0,0,21,")
    r = runner.invoke(main, ["usage", "--store", dsn, "--since", "next tuesday"])
    assert r.exit_code != 0 and "cannot read time" in r.output


def test_store_key_budgets_and_what_is_left(tmp_path, upstream):
    dsn = f"sqlite:///{tmp_path}/k.db"
    runner = CliRunner()
    r = runner.invoke(main, ["keys", "create", "dave", "--store", dsn, "--budget", "5 coins/day"])
    assert r.exit_code != 0 and "unknown unit 'coins'" in r.output
    r = runner.invoke(
        main,
        ["keys", "create", "dave", "--owner", "ops", "--store", dsn, "--budget", "250 tokens/day"],
    )
    assert r.exit_code == 0, r.output
    key = r.stdout.strip().splitlines()[0]
    config = parse_config(
        {
            "channels": [{"name": "c", "base_url": upstream.url}],
            "store": {"dsn": dsn, "journal_path": str(tmp_path / "j")},
            "store_keys": True,
        }
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
    statuses = []
    with ServerThread(create_app(config)) as gw:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the store's keys are loaded within seconds
            s = httpx.post(gw.url + "/v1/chat/completions", json=body, headers={"x-api-key": key})
            if s.status_code != 401:
                statuses.append(s.status_code)
                break
            time.sleep(0.1)
        for _ in range(3):
            statuses.append(
                httpx.post(
                    gw.url + "/v1/chat/completions", json=body, headers={"x-api-key": key}
                ).status_code
            )
    assert statuses == [200, 200, 200, 429]  # 107 tokens each: 321 crosses 250
    r = runner.invoke(main, ["keys", "list", "--store", dsn, "--json"])
    [row] = json.loads(r.output)
    assert row["budgets"] == [{"budget": "250 tokens/day", "used": 321, "left": 0}]
    r = runner.invoke(main, ["keys", "budget", "dave", "1k tokens/day"])
    assert r.exit_code != 0  # no store given: the default file has no such key
    r = runner.invoke(main, ["keys", "budget", "dave", "1k tokens/day", "--store", dsn])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["keys", "list", "--store", dsn])
    assert "key   1k tokens/day" in r.output and "used 321  left 679" in r.output
