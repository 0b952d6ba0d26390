"""Dashboard sessions and login attempts on both backends: rows keyed by the token's
digest, and attempts counted exactly even when they race from separate connections."""

from __future__ import annotations

import threading

from prefixgate.store import Store, open_store
from prefixgate.store.base import SessionRow

T0 = 1_700_000_000.0


def test_session_rows_round_trip_touch_and_prune(store: Store) -> None:
    store.migrate()
    row = SessionRow("a" * 64, "f" * 64, T0, T0, T0 + 3600)
    store.create_session(row)
    assert store.get_session(row.digest) == row
    assert store.get_session("b" * 64) is None
    store.touch_session(row.digest, T0 + 10)
    store.touch_session(row.digest, T0 + 5)  # never moves back
    assert store.get_session(row.digest).last_seen == T0 + 10
    idle = SessionRow("c" * 64, "f" * 64, T0, T0, T0 + 3600)
    store.create_session(idle)
    # At T0 + 100 with a 95 s idle lifetime: the idle one goes, the touched one stays.
    assert store.prune_sessions(T0 + 100, 95) == 1
    assert store.get_session(idle.digest) is None and store.get_session(row.digest)
    assert store.prune_sessions(T0 + 3600, 10_000) == 1  # its absolute expiry
    assert store.delete_session(row.digest) is False


def test_racing_login_attempts_are_counted_exactly(dsn: str) -> None:
    with open_store(dsn) as first:
        first.migrate()
    results: list[bool] = []
    start = threading.Barrier(12)

    def attempt() -> None:
        with open_store(dsn) as own:  # a connection of its own, as another worker's
            start.wait()
            results.append(own.login_attempt("10.1.2.3", T0, window=60, limit=5))

    threads = [threading.Thread(target=attempt) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True] * 5
    with open_store(dsn) as store:
        assert store.login_attempt("10.9.9.9", T0, window=60, limit=5)
        assert not store.login_attempt("10.1.2.3", T0 + 59, window=60, limit=5)
        assert store.login_attempt("10.1.2.3", T0 + 60, window=60, limit=5)


def test_racing_admin_checks_are_counted_exactly(dsn: str) -> None:
    """Admin credential checks (admin_attempts.py) from separate connections, as from
    several workers: 5 wrong keys from an address in all; a check that proved right is
    taken back and makes its address trusted past the bound of every address together."""
    with open_store(dsn) as first:
        first.migrate()
    waits: list[float | None] = []
    start = threading.Barrier(12)
    bounds = {"window": 60.0, "per_address": 5, "in_all": 8, "trusted_since": T0 - 86400}

    def check(i: int) -> None:
        with open_store(dsn) as own:
            start.wait()
            waits.append(own.admin_attempt(f"a{i}", "10.1.2.3", T0, **bounds))

    threads = [threading.Thread(target=check, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert waits.count(None) == 5 and all(w == 60.0 for w in waits if w is not None)
    with open_store(dsn) as store:
        assert store.admin_attempt("ok", "10.7.7.7", T0 + 1, **bounds) is None
        store.admin_success("ok", "10.7.7.7", T0 + 1, forget=86400)  # no failure: taken back
        for i in range(3):  # 8 in all now
            assert store.admin_attempt(f"b{i}", f"10.2.0.{i}", T0 + 2, **bounds) is None
        assert store.admin_attempt("c", "10.3.0.1", T0 + 3, **bounds) == 57.0  # a stranger
        assert store.admin_attempt("d", "10.7.7.7", T0 + 3, **bounds) is None  # the admin's
        assert store.admin_attempt("e", "10.1.2.3", T0 + 61, **bounds) is None  # aged out
