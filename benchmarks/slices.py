"""CPU slices for benchmarked processes: each process gets its own share of a core.

A slice is a cgroup (v1) of the CPU controller with a CFS quota: ``fraction`` of each
``period`` of CPU time at most, and a high weight (``cpu.shares``) so that other work on the
machine cannot take the slice's time while it wants it. The processes are also pinned to
cores with their affinity mask (every thread). Where the cgroup file system is not
writable (no root, cgroup v2 only), :class:`Slices` says so and only pins: one whole core
a process.

    with Slices(period_us=10_000) as slices:
        group = slices.make("w0", 0.35)
        group.add(pid)
        ...
        group.stat()  # {"nr_periods": ..., "nr_throttled": ..., "throttled_time": ns}
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PREFIX = "prefixgate-bench"
SHARES = 20_000  # twenty times a nice-0 task's weight (1024)


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` on ``cpus`` (threads started later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
            os.sched_setaffinity(int(task.name), cpus)


class Group:
    """One slice: a cgroup with a quota."""

    def __init__(self, path: Path, fraction: float | None, period_us: int) -> None:
        self.path, self.fraction = path, fraction
        path.mkdir()
        (path / "cpu.shares").write_text(str(SHARES))
        if fraction is not None:
            (path / "cpu.cfs_period_us").write_text(str(period_us))
            (path / "cpu.cfs_quota_us").write_text(str(max(1000, round(fraction * period_us))))

    def add(self, pid: int) -> None:
        """Move ``pid`` (all its threads) into the slice."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def stat(self) -> dict[str, int]:
        out = {}
        for line in (self.path / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            out[key] = int(value)
        return out

    def remove(self) -> None:
        _remove(self.path)


class Slices:
    """The slices of one benchmark run (named after this process), removed on close;
    ``available`` is False when cgroups cannot be made here (then only pin)."""

    def __init__(self, period_us: int = 10_000) -> None:
        self.period_us = period_us
        self.groups: list[Group] = []
        self.why_not = _unavailable()
        _remove_stale()

    @property
    def available(self) -> bool:
        return self.why_not is None

    def make(self, name: str, fraction: float | None) -> Group:
        """A slice of ``fraction`` of a core (None: no quota, only the weight)."""
        group = Group(CPU_ROOT / f"{PREFIX}-{os.getpid()}-{name}", fraction, self.period_us)
        self.groups.append(group)
        return group

    def close(self) -> None:
        while self.groups:
            self.groups.pop().remove()

    def __enter__(self) -> Slices:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _unavailable() -> str | None:
    """Why slices cannot be made here, or None when they can."""
    if not (CPU_ROOT / "cpu.cfs_quota_us").exists():
        return f"no cgroup v1 CPU controller at {CPU_ROOT}"
    if not os.access(CPU_ROOT, os.W_OK):
        return f"{CPU_ROOT} is not writable"
    return None


def _remove_stale() -> None:
    """Groups an earlier run left (it was killed) whose owner is gone."""
    if not CPU_ROOT.is_dir():
        return
    for path in CPU_ROOT.glob(f"{PREFIX}-*"):
        owner = path.name.removeprefix(PREFIX + "-").split("-", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            _remove(path)


def _remove(path: Path) -> None:
    """Hand what is still inside back to the root group, then delete the group."""
    with contextlib.suppress(OSError):
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (CPU_ROOT / "cgroup.procs").write_text(pid)
    with contextlib.suppress(OSError):
        path.rmdir()
