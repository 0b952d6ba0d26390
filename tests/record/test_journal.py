"""The record journal on disk: one slot per live process, what dead processes left taken
over, segments rotated and deleted once stored, reads that stop at whole lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prefixgate.record.journal import Journal, Position
from tests.record.test_writer import expected, make

KILLED = """
import os, signal, sys
from prefixgate.record.journal import Journal
from tests.record.test_writer import make
journal = Journal(sys.argv[1], segment_bytes=4096)
journal.open()
first = int(sys.argv[2])
for i in range(first, first + int(sys.argv[3])):
    assert journal.append(make(i)) is not None
os.kill(os.getpid(), signal.SIGKILL)
"""


def killed_after_appending(root: Path, first: int, n: int) -> None:
    """A process that appends records ``first..first+n`` and is killed (SIGKILL)."""
    proc = subprocess.run(
        [sys.executable, "-c", KILLED, str(root), str(first), str(n)],
        capture_output=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr.decode()


def read_all(journal: Journal) -> list[str]:
    records, _, end = journal.read(journal.start(), dict(journal.sizes), 1 << 30)
    assert end == journal.end
    return [r.request_id for r in records]


def test_live_processes_get_their_own_slots(tmp_path: Path) -> None:
    a, b = Journal(tmp_path / "j"), Journal(tmp_path / "j")
    assert (a.open(), b.open()) == (0, 0)
    assert (a.slot, b.slot) == (tmp_path / "j" / "0", tmp_path / "j" / "1")
    for i in range(10):
        (a if i % 2 else b).append(make(i))
    assert read_all(a) == [f"req-{i:06d}" for i in range(1, 10, 2)]
    assert read_all(b) == [f"req-{i:06d}" for i in range(0, 10, 2)]
    # A third journal opened now takes nothing over: both slots are held.
    c = Journal(tmp_path / "j")
    assert c.open() == 0 and c.slot == tmp_path / "j" / "2"
    c.close(everything_stored=True)
    a.close(everything_stored=True)  # a's slot goes; b's stays
    assert sorted(p.name for p in (tmp_path / "j").iterdir()) == ["1"]
    b.close(everything_stored=False)
    d = Journal(tmp_path / "j")
    assert d.open() == 5  # b is gone: its records are the backlog
    d.close(everything_stored=False)


def test_what_killed_processes_left_is_taken_over_in_order(tmp_path: Path) -> None:
    root = tmp_path / "j"
    holder = Journal(root)  # a live process on slot 0
    holder.open()
    killed_after_appending(root, 0, 30)  # slot 1
    killed_after_appending(root, 30, 30)  # slot 1 again: it was free
    holder.close(everything_stored=True)  # slot 0 is free, empty
    journal = Journal(root)
    assert journal.open() == 60
    assert journal.slot == root / "0"
    assert read_all(journal) == expected(60)
    assert sorted(p.name for p in root.iterdir()) == ["0"]  # slot 1 was emptied and removed
    journal.append(make(60))
    assert read_all(journal) == expected(61)
    journal.close(everything_stored=False)


def test_segments_rotate_and_go_once_stored(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j", segment_bytes=4096)
    journal.open()
    ends = [journal.append(make(i)) for i in range(100)]
    assert all(e is not None for e in ends)
    segments = sorted(journal.sizes)
    assert len(segments) > 5
    assert journal.bytes == sum(journal.sizes.values())
    assert journal.bytes == sum(p.stat().st_size for p in journal.slot.glob("*.jsonl"))
    # Everything up to record 49 is stored: the segments wholly before it can go.
    upto = ends[49]
    done = journal.stored(upto)
    assert done == [s for s in segments if s < upto.seq]
    journal.delete(done)
    assert sorted(int(p.stem) for p in journal.slot.glob("*.jsonl")) == sorted(journal.sizes)
    records, lines, end = journal.read(upto, dict(journal.sizes), 1000)
    assert [r.request_id for r in records] == expected(100, 50) and lines == 50
    assert end == journal.end
    # The segment being written is never handed out, even when all of it is stored.
    older = [s for s in sorted(journal.sizes) if s < end.seq]
    assert older and journal.stored(journal.end) == older
    assert list(journal.sizes) == [end.seq]
    journal.close(everything_stored=True)
    assert not (tmp_path / "j").exists()


def test_a_read_stops_at_the_sizes_it_was_given(tmp_path: Path) -> None:
    """The writer's thread reads while the loop's thread appends: it never reads past the
    sizes recorded when it started, so it never sees part of a line."""
    journal = Journal(tmp_path / "j", segment_bytes=4096)
    journal.open()
    for i in range(20):
        journal.append(make(i))
    snapshot = dict(journal.sizes)
    for i in range(20, 40):
        journal.append(make(i))
    records, lines, end = journal.read(journal.start(), snapshot, 1000)
    assert [r.request_id for r in records] == expected(20) and lines == 20
    records, _, _ = journal.read(end, dict(journal.sizes), 5)
    assert [r.request_id for r in records] == expected(25, 20)
    journal.close(everything_stored=False)


def test_half_a_line_left_by_a_crash_is_skipped(tmp_path: Path) -> None:
    killed_after_appending(tmp_path / "j", 0, 10)
    segment = sorted((tmp_path / "j" / "0").glob("*.jsonl"))[-1]  # the one written last
    data = segment.read_bytes()
    segment.write_bytes(data + data[:50])  # a write cut short by the crash
    journal = Journal(tmp_path / "j")
    assert journal.open() == 10
    assert read_all(journal) == expected(10)
    assert journal.end == Position(journal.end.seq, 0)  # appends go to a new segment
    journal.close(everything_stored=False)
