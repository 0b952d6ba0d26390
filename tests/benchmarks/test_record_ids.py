"""benchmarks/record_ids.py runs and shows what it measures: a random id writes more of
the store's pages a batch than a time-ordered one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_time_ordered_ids_write_fewer_pages_a_batch() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH / "record_ids.py"), "--records", "3000", "--batches", "30"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    rows = {}
    for line in out.splitlines():
        name, _, rest = line.partition("  ")
        if name in ("random", "time-ordered"):
            pages, cpu = rest.split()[0:3:2], rest.split()[3:6:2]
            rows[name] = ([float(p) for p in pages], [float(c) for c in cpu])
    assert set(rows) == {"random", "time-ordered"}
    assert all(c > 0 for _, cpus in rows.values() for c in cpus)
    # the unique indexes on the id: a random page of each a record, against their last
    assert max(rows["time-ordered"][0]) + 2 < min(rows["random"][0])
