"""Session lifetimes on a clock the test moves, over a real SQLite store: activity keeps a
session alive up to its absolute lifetime, idleness ends it, a changed admin key ends it."""

from __future__ import annotations

import hashlib

from prefixgate.config import DashboardConfig
from prefixgate.store import open_store
from prefixgate.web.sessions import Sessions, token_digest


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


ADMIN = hashlib.sha256(b"admin").hexdigest()


def sessions(dsn: str, clock: Clock, admin: str = ADMIN, **config) -> Sessions:
    return Sessions(dsn, admin, DashboardConfig(**config), clock)


def test_activity_keeps_a_session_alive_until_its_absolute_lifetime(tmp_path):
    dsn, clock = f"sqlite:///{tmp_path / 's.db'}", Clock()
    s = sessions(dsn, clock, session_idle_seconds=100, session_max_seconds=1000)
    token = s.open()
    for _ in range(9):  # a request every 90 s: never idle for 100
        clock.now += 90
        assert s.valid(token)
    clock.now += 90  # 900 s in: still alive; 1,000 s in: over, however active
    assert s.valid(token)
    clock.now += 100
    assert not s.valid(token)
    with open_store(dsn) as store:
        assert store.get_session(token_digest(token)) is None


def test_idleness_ends_a_session(tmp_path):
    dsn, clock = f"sqlite:///{tmp_path / 's.db'}", Clock()
    s = sessions(dsn, clock, session_idle_seconds=100)
    token = s.open()
    clock.now += 99
    assert s.valid(token)
    clock.now += 99  # 99 s after the last use
    assert s.valid(token)
    clock.now += 100
    assert not s.valid(token)
    assert not s.valid(token)  # gone for good, even if the clock went back
    clock.now -= 150
    assert not s.valid(token)


def test_a_new_admin_key_ends_the_sessions_of_the_old_one(tmp_path):
    dsn, clock = f"sqlite:///{tmp_path / 's.db'}", Clock()
    old = sessions(dsn, clock)
    token = old.open()
    new = sessions(dsn, clock, admin=hashlib.sha256(b"rotated").hexdigest())
    assert not new.valid(token) and old.valid(token)
    assert new.valid(new.open())


def test_logins_prune_expired_sessions_and_attempts_slide(tmp_path):
    dsn, clock = f"sqlite:///{tmp_path / 's.db'}", Clock()
    s = sessions(dsn, clock, session_idle_seconds=100, login_attempts_per_minute=2)
    stale = s.open()
    clock.now += 500
    s.open()
    with open_store(dsn) as store:
        assert store.get_session(token_digest(stale)) is None
    assert s.attempt("10.0.0.1") and s.attempt("10.0.0.1")
    assert not s.attempt("10.0.0.1") and s.attempt("10.0.0.2")
    clock.now += 60.5  # the window has slid past the first two
    assert s.attempt("10.0.0.1")
    assert not s.valid("") and not s.valid("x" * 500)
