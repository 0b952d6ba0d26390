"""benchmarks/pyops.py: a program's bytecodes counted by function, from a signal on, and
two counts compared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYOPS = ROOT / "benchmarks" / "pyops.py"

PROGRAM = """
import os, signal, sys, threading

def work(n):
    total = 0
    for i in range(n):
        total += i
    return total

def in_a_thread():
    work(int(sys.argv[2]))

work(1000)  # before the signal: forgotten
os.kill(os.getpid(), signal.SIGUSR1)
work(int(sys.argv[1]))
t = threading.Thread(target=in_a_thread)
t.start()
t.join()
"""


def _run(tmp: Path, name: str, n: int, m: int) -> Path:
    (tmp / "opsdemo.py").write_text(PROGRAM)
    out = tmp / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": str(tmp)}
    cmd = [sys.executable, str(PYOPS), str(out), "-m", "opsdemo", str(n), str(m)]
    subprocess.run(cmd, check=True, env=env, timeout=120)
    return out


def _work_ops(path: Path) -> int:
    rows = json.loads(path.read_text())
    return sum(n for f, _, name, n in rows if name == "work" and f.endswith("opsdemo.py"))


def test_counts_scale_with_the_work_done_after_the_signal_in_every_thread(tmp_path) -> None:
    small = _work_ops(_run(tmp_path, "small", 100, 100))
    large = _work_ops(_run(tmp_path, "large", 300, 500))
    # the loop's bytecodes per item are the same; 200 items in one run, 600 in the other
    # (the 1,000 before the signal forgotten in both); the fixed part cancels out
    assert small > 200
    per_item = (large - small) / 600
    assert 3 <= per_item <= 12
    assert small < 1000 * per_item  # the warm-up is not in it


def test_diff_prints_what_one_runs_more_than_the_other(tmp_path) -> None:
    a, b = _run(tmp_path, "a", 300, 500), _run(tmp_path, "b", 100, 100)
    out = subprocess.run(
        [sys.executable, str(PYOPS), "--diff", str(a), str(b), "--per", "2", "--top", "5"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    line = next(x for x in out.splitlines() if x.strip().endswith(" work"))
    assert abs(int(line.split()[0].replace(",", "")) - (_work_ops(a) - _work_ops(b)) / 2) <= 0.5
    assert "by module" in out and "opsdemo.py" in out
