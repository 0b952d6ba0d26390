"""Rows 2 and 8 of the security review (issue 29): the admin key cannot be guessed
without limit through any admin credential check, the guessing cannot lock the admin out,
and the dashboard's key filter works."""

from __future__ import annotations

import hashlib
import re

import httpx
import pytest

from prefixgate.store import open_store

ADMIN = "the-admin-key-of-this-test"
ATTACKER, ADMIN_ADDR, OTHER = "203.0.113.5", "198.51.100.7", "192.0.2.9"


@pytest.fixture
def guarded(gateway, tmp_path):
    """A gateway with keys, an admin key and a dashboard, behind a trusted proxy (the
    test's own address), so X-Forwarded-For names the client."""
    dsn = str(tmp_path / "records.db")
    with open_store(dsn) as store:
        store.migrate()
    return gateway(
        keys=[{"name": "alice", "key_sha256": hashlib.sha256(b"client-key").hexdigest()}],
        admin_key_sha256=hashlib.sha256(ADMIN.encode()).hexdigest(),
        store={"dsn": dsn},
        server={
            "trusted_proxies": ["127.0.0.1"],
            "admin_failures_per_minute": 5,
            "admin_failures_in_all_per_minute": 12,
        },
    )


def get(gw, path: str, key: str, client: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", "x-forwarded-for": client}
    return httpx.get(gw.url + path, headers=headers)


ADMIN_PATHS = ("/metrics", "/healthz?details", "/dashboard/api/meta")


@pytest.mark.parametrize("path", ADMIN_PATHS)
def test_wrong_admin_keys_from_one_address_are_refused_without_a_look(guarded, path):
    statuses = [get(guarded, path, f"guess-{i}", ATTACKER).status_code for i in range(7)]
    assert statuses == [401] * 5 + [429] * 2
    locked = get(guarded, path, ADMIN, ATTACKER)  # even the right key: it is not looked at
    assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 1
    assert get(guarded, path, ADMIN, ADMIN_ADDR).status_code == 200  # the admin elsewhere


def test_the_bound_is_shared_by_every_admin_check(guarded):
    for i, path in enumerate(ADMIN_PATHS * 2):
        get(guarded, path, f"guess-{i}", ATTACKER)
    assert get(guarded, "/metrics", ADMIN, ATTACKER).status_code == 429


def test_guessing_from_many_addresses_does_not_lock_the_admin_out(guarded):
    assert get(guarded, "/metrics", ADMIN, ADMIN_ADDR).status_code == 200
    for n in range(3):  # 12 failures in all, 4 from each address
        for i in range(4):
            assert get(guarded, "/metrics", f"g{i}", f"203.0.113.{n}").status_code == 401
    assert get(guarded, "/metrics", "g", OTHER).status_code == 429  # a new address waits
    assert get(guarded, "/metrics", ADMIN, OTHER).status_code == 429
    assert get(guarded, "/metrics", ADMIN, ADMIN_ADDR).status_code == 200  # the admin does not


def test_the_login_form_counts_against_the_same_bound(guarded):
    form = {"key": "wrong"}
    headers = {"x-forwarded-for": ATTACKER}
    for _ in range(5):
        httpx.post(guarded.url + "/dashboard/login", data=form, headers=headers)
    assert get(guarded, "/metrics", ADMIN, ATTACKER).status_code == 429


def test_an_untrusted_forwarded_for_is_ignored(gateway, tmp_path):
    gw = gateway(
        admin_key_sha256=hashlib.sha256(ADMIN.encode()).hexdigest(),
        keys=[{"name": "alice", "key_sha256": hashlib.sha256(b"k").hexdigest()}],
        server={"admin_failures_per_minute": 3},
    )
    for i in range(3):  # a new X-Forwarded-For each time: the peer's address is counted
        assert get(gw, "/metrics", "guess", f"192.0.2.{i}").status_code == 401
    assert get(gw, "/metrics", ADMIN, "192.0.2.99").status_code == 429


def test_the_dashboard_key_filter_is_a_filter(guarded):
    headers = {"authorization": f"Bearer {ADMIN}", "x-forwarded-for": ADMIN_ADDR}
    for path in ("/dashboard/api/overview", "/dashboard/api/requests", "/dashboard"):
        r = httpx.get(guarded.url + path, params={"key": "alice"}, headers=headers)
        assert r.status_code == 200, (path, r.text[:200])
    for credential in (ADMIN, "client-key", "pg-" + "A1b2" * 10 + "xyz"):
        r = httpx.get(
            guarded.url + "/dashboard/api/overview", params={"key": credential}, headers=headers
        )
        assert r.status_code == 400 and "never accepted in a URL" in r.text, credential
        assert credential not in r.text


def test_the_bound_holds_across_workers(tmp_path, upstream):
    """``serve --workers 2`` on one store: the failures are counted where both workers see
    them, so an address gets 5 wrong admin keys in all, not 5 on each worker (new
    connections each time: the kernel spreads them over both, which the scrapes with the
    right key from another address show)."""
    from tests.serve.served import Served

    cfg = {
        "embedded_upstream": False,
        "channels": [{"name": "main", "base_url": upstream.url}],
        "keys": [{"name": "alice", "key_sha256": hashlib.sha256(b"client-key").hexdigest()}],
        "admin_key_sha256": hashlib.sha256(ADMIN.encode()).hexdigest(),
        "store": {"dsn": f"sqlite:///{tmp_path / 'records.db'}", "journal_path": None},
        "server": {"trusted_proxies": ["127.0.0.1"], "admin_failures_per_minute": 5},
    }
    close = {"connection": "close"}
    with Served(tmp_path, cfg, "--workers", "2") as gw:
        pids = set()
        for _ in range(20):
            r = httpx.get(gw.url + "/metrics", headers={**close, "authorization": f"Bearer {ADMIN}",
                                                        "x-forwarded-for": ADMIN_ADDR})  # fmt: skip
            assert r.status_code == 200
            pids |= set(re.findall(r'prefixgate_worker_info\{pid="(\d+)"\}', r.text))
        assert len(pids) == 2  # both workers answer new connections
        statuses = [
            httpx.get(gw.url + "/metrics", headers={**close, "authorization": f"Bearer g{i}",
                                                    "x-forwarded-for": ATTACKER}).status_code
            for i in range(12)
        ]  # fmt: skip
        assert statuses == [401] * 5 + [429] * 7
        for path in ("/metrics", "/healthz?details", "/dashboard/api/meta"):
            r = get(gw, path, ADMIN, ATTACKER)
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, path
        assert get(gw, "/metrics", ADMIN, ADMIN_ADDR).status_code == 200
    assert gw.returncode == 0, gw.output
