"""The demo reproduces the incident and the fix (a small run of the real thing)."""

from __future__ import annotations

import contextlib

from prefixgate.lab import incident
from prefixgate.store import open_store


@contextlib.contextmanager
def _no_progress(name, total):
    yield lambda: None


def test_demo_reproduces_the_incident_and_the_fix(tmp_path):
    path = str(tmp_path / "demo.db")
    kept, stripped = incident.run_demo(
        sessions=4, turns=8, store_path=path, progress_factory=_no_progress
    )
    km, kc = kept.entries["messages"], kept.entries["chat"]
    sm, sc = stripped.entries["messages"], stripped.entries["chat"]
    assert km.errors == kc.errors == sm.errors == sc.errors == 0
    # The incident: Claude-Code-like requests pinned at one block-aligned constant (the tools).
    assert km.pinned_value is not None and km.pinned_value % incident.BLOCK == 0
    assert km.pinned_count >= km.requests - 1
    # The fix: the in-session hit rate recovers; the control group is high in both phases.
    assert sm.in_session_hit_rate > 0.9 > km.in_session_hit_rate + 0.15
    assert sm.pinned_value is None
    assert kc.hit_rate == sc.hit_rate and kc.in_session_hit_rate > 0.9
    # Every request is in the store, for the doctor.
    with open_store(kept.dsn) as store:
        assert store.count() == km.requests + kc.requests
    with open_store(stripped.dsn) as store:
        assert store.count() == sm.requests + sc.requests
    assert stripped.dsn.endswith("demo-fixed.db")
