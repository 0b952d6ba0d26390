"""The doctor for one key holder (doctor/holder.py): the findings of a key's own records,
every kind the records make, and nothing of another key's; on SQLite and Postgres."""

from __future__ import annotations

import json

import pytest

from prefixgate.doctor import diagnose
from prefixgate.doctor.holder import HolderRecords
from prefixgate.store import StoreError, open_store

from .test_ledger import write

# alice's requests: evicted by the engine, and a template that hoists system messages;
# bob's: cached on another replica than the one they were sent to.
ALICE = [("evicting", "http://a/v1", {"hit": 600, "evicted": 380, "partial_block": 20})] * 10
HOISTS = [("hoists", "http://a/v1", {"hit": 100, "prefix_changed": 880, "partial_block": 20})] * 6
BOB = [("spread", "http://a/v1", {"hit": 500, "elsewhere": 480, "partial_block": 20})] * 10


@pytest.fixture
def two_keys(store_dsn) -> str:
    write(store_dsn, ALICE, key="alice")
    write(store_dsn, HOISTS, changed=lambda i: f"messages[{3 * i + 2}]:system@head", key="alice")
    write(store_dsn, BOB, key="bob")
    return store_dsn


def _kinds(dsn: str, **kw) -> dict[str, str]:
    d = diagnose(dsn, policies={"spread": "round_robin"}, **kw)
    return {
        f.kind: json.dumps(f.facts, default=str) + f.title + " ".join(f.summary) for f in d.findings
    }


def test_each_key_sees_the_findings_of_its_own_records_only(two_keys):
    every = _kinds(two_keys)
    assert {"kv_capacity", "template_hoisting", "routing_loss"} <= set(every)
    alice = _kinds(two_keys, key="alice")
    assert {"kv_capacity", "template_hoisting"} <= set(alice) and "routing_loss" not in alice
    assert "spread" not in " ".join(alice.values())
    bob = _kinds(two_keys, key="bob")
    assert "routing_loss" in bob and not {"kv_capacity", "template_hoisting"} & set(bob)
    assert not any(ch in " ".join(bob.values()) for ch in ("evicting", "hoists"))
    assert set(_kinds(two_keys, key="carol")) == {"no_problem"}  # no records: nothing


def test_the_holders_store_reads_no_other_table(two_keys):
    with open_store(two_keys) as store:
        own = HolderRecords(store, "bob", 0.0)
        assert own.query("SELECT COUNT(*) FROM requests") == [(10,)]
        joined = own.query(
            "SELECT COUNT(*) FROM ledgers l JOIN requests r ON r.request_id = l.request_id"
            " WHERE r.channel = ?",
            ["evicting"],
        )
        assert joined == [(0,)]
        assert own.query("SELECT COUNT(*) FROM ledgers") == [(10,)]
        with pytest.raises(StoreError, match="api_keys"):
            own.query("SELECT name FROM api_keys")
