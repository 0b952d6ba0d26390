"""The SQLite store's parameter adapters (``store/sqlite.py``): None and bools are bound
as the ``sqlite3`` module binds them without adapters, only without its failed lookup."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import prefixgate.store.sqlite  # noqa: F401  (registers the adapters)

VALUES = (None, True, False, 0, 1, 2.5, "x", b"\x00b")
PROBE = f"""
import json, sqlite3, sys
c = sqlite3.connect(":memory:")
c.execute("CREATE TABLE t (v)")
c.executemany("INSERT INTO t VALUES (?)", [(v,) for v in {VALUES!r}])
rows = c.execute("SELECT typeof(v), quote(v) FROM t ORDER BY rowid").fetchall()
json.dump([list(r) for r in rows], sys.stdout)
"""


def test_none_and_bools_bound_as_sqlite3_binds_them_unadapted() -> None:
    """The same storage class and value for each, against a process that never imported
    the store (``sqlite3`` as it comes)."""
    plain = json.loads(
        subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
        ).stdout
    )
    c = sqlite3.connect(":memory:")
    c.execute("CREATE TABLE t (v)")
    c.executemany("INSERT INTO t VALUES (?)", [(v,) for v in VALUES])
    here = [list(r) for r in c.execute("SELECT typeof(v), quote(v) FROM t ORDER BY rowid")]
    assert here == plain
    assert here[:3] == [["null", "NULL"], ["integer", "1"], ["integer", "0"]]
    # the module's adapters are what this process uses
    assert sqlite3.adapters[(type(None), sqlite3.PrepareProtocol)] is not None
    assert sqlite3.adapters[(bool, sqlite3.PrepareProtocol)] is int
