"""What a stage pays for the objects it touches: a session's list walked, sliced or
compared once the turn's data has left the caches, against the same data packed.

    python benchmarks/touched.py [--items 300] [--runs 300] [--sweep-mb 32]

A gateway's memories hold each session's lists from turn to turn (messages, pieces,
segments, block names): their objects were made on earlier turns, scattered among
everything else made since, and by the next turn of the session they have left the
caches. A slice or a walk writes every item's reference count (a cache miss each); a
comparison of two lists holding the same objects reads only their pointers. Each figure is
the median of ``--runs`` runs, each after ``--sweep-mb`` MB of other data was written (as
in service), in microseconds; and the same operation warm, for scale.

Then one list of segments (a turn's ``segments_out`` at turn 60 holds ~270) two ways:
as the record's :class:`~prefixgate.record.record.Segment` objects (the identity walk
against the previous turn's list, a slice, the list's encode) and as a packed
table (16 bytes of hash and two 32-bit sizes a segment: one memcmp, one copy), with the
bytes each stores. Each figure is one operation alone; a turn does several of each.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import struct
import time

import msgspec

from prefixgate.record.record import Segment
from prefixgate.sequences import same_prefix


class Item(msgspec.Struct):
    text: str
    n: int


def scattered(n: int, make) -> tuple[list, list]:
    """``n`` objects made among other allocations (as a session's are, turn by turn), and
    what was allocated between them (kept alive, so they stay apart)."""
    items, between = [], []
    rng = random.Random(1)
    for i in range(n):
        between.append([object() for _ in range(rng.randint(50, 400))])
        items.append(make(i))
    return items, between


def timer(sweep_mb: int, runs: int):
    sweep = bytearray(sweep_mb << 20)

    def cold(f) -> float:
        times = []
        for _ in range(runs):
            sweep[::64] = bytes(len(sweep[::64]))  # a write to every cache line
            t = time.perf_counter_ns()
            f()
            times.append(time.perf_counter_ns() - t)
        times.sort()
        return times[len(times) // 2] / 1e3

    def warm(f) -> float:
        f()
        t = time.perf_counter_ns()
        for _ in range(runs):
            f()
        return (time.perf_counter_ns() - t) / runs / 1e3

    return cold, warm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=300)
    ap.add_argument("--segments", type=int, default=270)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--sweep-mb", type=int, default=32)
    args = ap.parse_args()
    cold, warm = timer(args.sweep_mb, args.runs)
    n = args.items
    items, _keep = scattered(n, lambda i: Item("x" * 50, i))
    other = list(items)  # another list of the same objects (the previous turn's)
    print(f"{n} scattered structs, us (cold: each run after {args.sweep_mb} MB written)")
    print(f"{'':<44}{'cold':>8}{'warm':>8}")
    ops = {
        "a slice (items[:n])": lambda: items[:n],
        "an identity walk (same_prefix)": lambda: same_prefix(items, other),
        "== of two lists of the same objects": lambda: items == other,
        "len (the timer's own cost)": lambda: len(items),
    }
    for name, f in ops.items():
        print(f"{name:<44}{cold(f):>8.1f}{warm(f):>8.2f}")

    m = args.segments
    segs, _keep2 = scattered(
        m,
        lambda i: Segment(
            "message",
            f"messages[{i}]:user",
            hashlib.blake2b(str(i).encode(), digest_size=16).hexdigest(),
            1000 + 37 * i,
            250 + 9 * i,
        ),
    )
    prev, cur = segs[: m - 3], list(segs)  # the previous turn's list, and three new
    row = struct.Struct("<16sII")

    def pack(ss: list[Segment]) -> bytes:
        return b"".join(row.pack(bytes.fromhex(s.hash), s.chars, s.tokens) for s in ss)

    pprev, pcur = pack(prev), pack(cur)

    def as_packed() -> None:
        k = len(pprev) if pcur[: len(pprev)] == pprev else 0
        pcur[:k]  # noqa: B018

    print(f"\none list of {m} segments against the previous turn's ({m - 3}), us")
    print(f"{'':<48}{'cold':>8}{'warm':>8}")
    for name, f in (
        ("objects: the identity walk (same_prefix)", lambda: same_prefix(cur, prev)),
        ("objects: a slice", lambda: cur[: m - 3]),
        ("objects: the list's whole encode", lambda: msgspec.json.encode(cur)),
        ("packed: one memcmp + one copy", as_packed),
    ):
        print(f"{name:<48}{cold(f):>8.1f}{warm(f):>8.2f}")
    print(f"stored: {len(msgspec.json.encode(cur))} bytes of JSON, {len(pcur)} packed")


if __name__ == "__main__":
    main()
