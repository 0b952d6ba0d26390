"""benchmarks/relay_chunks.py without valgrind: a callgrind dump's costs read by event
name, the arithmetic per chunk, and the lock step of interleaved streams through the bare
relay (benchmarks/overhead_floor.py): each stream gets all its chunks, the streams taking
turns in round robin."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import relay_chunks as rc  # noqa: E402

DUMP = """# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 4242
cmd:  python overhead_floor.py
part: 1

desc: I1 cache: 32768 B, 64 B, 8-way associative
desc: D1 cache: 32768 B, 64 B, 8-way associative
desc: LL cache: 2097152 B, 64 B, 16-way associative
desc: Timerange: Basic block 0 - 90000
desc: Trigger: Program termination

positions: line
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
summary: 126561 27882 11769 1083 990 580 1065 781 548


ob=(1) /usr/bin/python3
fl=(1) ???
fn=(1) main
0 126559 27882 11769 1082 990 580 1064 781 548

totals: 126559 27882 11769 1082 990 580 1064 781 548
"""


def test_a_dump_is_read_by_event_name():
    costs = rc.parse_dump(DUMP)
    assert costs["Ir"] == 126561  # the summary line, before the totals
    assert (costs["D1mr"], costs["D1mw"], costs["DLmr"], costs["DLmw"]) == (990, 580, 781, 548)
    assert len(costs) == 9


def test_events_in_another_order_or_left_off_and_totals_without_a_summary():
    text = "events: DLmw Ir D1mr\npositions: line\nfn=(1) f\n0 1 2\ntotals: 7 1000\n"
    assert rc.parse_dump(text) == {"DLmw": 7, "Ir": 1000, "D1mr": 0}
    assert rc.parse_dump("events: Ir\nsummary: 55\n") == {"Ir": 55}
    with pytest.raises(ValueError):
        rc.parse_dump("events: Ir\n")
    with pytest.raises(ValueError):
        rc.parse_dump("events: Ir\nsummary: 1 2\n")


def test_per_chunk_is_the_difference_over_the_chunks_between_the_lengths():
    short = {"Ir": 1_000_000, "D1mr": 500, "D1mw": 100, "DLmr": 50, "DLmw": 10}
    long_ = {"Ir": 5_000_000, "D1mr": 4500, "D1mw": 2100, "DLmr": 850, "DLmw": 410}
    # 2 rounds of 10 streams, 4 and 44 chunks: 2 × 10 × 40 = 800 chunks between them
    figures = rc.per_chunk(short, long_, (4, 44), 2, 10)
    assert figures == {
        "per_chunk": 4_000_000 / 800,
        "d1_misses_per_chunk": (4000 + 2000) / 800,
        "ll_misses_per_chunk": (800 + 400) / 800,
    }
    # without the cache simulation the dumps have Ir only: so do the figures
    assert rc.per_chunk({"Ir": 100}, {"Ir": 900}, (8, 200), 5, 1) == {"per_chunk": 800 / 960}
    assert rc.added_key("per_chunk") == "added"
    assert rc.added_key("ll_misses_per_chunk") == "ll_misses_added"


def test_the_stream_index_travels_in_the_model():
    assert rc.parse_model(rc.model_name(200)) == (200, 0)
    assert rc.parse_model(rc.model_name(44, 37)) == (44, 37)


def test_a_lock_step_round_goes_round_robin():
    """The Lockstep alone, with upstreams that record when they are told to write."""
    written: list[tuple[int, int]] = []

    class Up:
        def __init__(self, i: int) -> None:
            self.i, self.sent = i, 1

        def next(self) -> None:
            written.append((self.i, self.sent))
            self.sent += 1

    lock = rc.Lockstep()
    lock.begin(3)
    ups = [Up(i) for i in range(3)]
    for i in (2, 0, 1):  # the first chunks arrive in any order
        lock.answering(i, ups[i])
        lock.received(i, 1)
    assert written == [(0, 1)]  # all have started: stream 0 goes first
    for _ in range(5):
        i, k = written[-1]
        lock.received(i, k + 1)
    assert written == [(0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2)]
    lock.finished(2)  # stream 2 ended: its turn passes on, and it is skipped from now on
    assert written[-1] == (0, 3)
    lock.received(0, 4)
    assert written[-1] == (1, 3)


async def _through_floor(port: int, m: int, chunks: int, rounds: int) -> rc.Lockstep:
    loop = asyncio.get_running_loop()
    lock = rc.Lockstep()
    server = await loop.create_server(lambda: rc.Upstream(lock), "127.0.0.1", 0)
    up_port = server.sockets[0].getsockname()[1]
    relay = subprocess.Popen(
        [sys.executable, str(BENCH / "overhead_floor.py"), "--port", str(port)]
        + ["--upstream-port", str(up_port)]
    )
    clients: list[rc.Client] = []
    try:
        for _ in range(400):
            try:
                _, client = await loop.create_connection(lambda: rc.Client(lock), "127.0.0.1", port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("the floor relay did not come up")
        clients.append(client)
        for i in range(1, m):
            _, client = await loop.create_connection(
                lambda i=i: rc.Client(lock, i), "127.0.0.1", port
            )
            clients.append(client)
        await asyncio.wait_for(rc.rounds(clients, lock, "chat", chunks, rounds), 60)
        for c in clients:  # the last round's streams, whole and in order
            body = c.buf
            pieces = [body.index(b'" w%d"' % k) for k in range(chunks)]
            assert pieces == sorted(pieces) and body.count(rc.MARK) == chunks
            assert b"[DONE]" in body
        return lock
    finally:
        for c in clients:
            c.transport.close()
        relay.terminate()
        relay.wait(10)
        server.close()


def test_interleaved_streams_through_the_floor_take_turns_in_round_robin():
    m, chunks = 5, 6
    lock = asyncio.run(_through_floor(rc.ov.free_port(), m, chunks, 2))
    first, rest = lock.order[:m], lock.order[m:]
    assert sorted(first) == [(i, 0) for i in range(m)]  # every stream started
    # then one chunk of each stream in turn: M − 1 others between two of one stream
    assert rest == [(i, k) for k in range(1, chunks) for i in range(m)]
    assert lock.ended == list(range(m))
    assert all(up is not None for up in lock.ups)
    assert len({id(up) for up in lock.ups}) == m  # each stream its own upstream connection


def test_one_stream_at_a_time_is_the_plain_lock_step():
    lock = asyncio.run(_through_floor(rc.ov.free_port(), 1, 4, 3))
    assert lock.order == [(0, k) for k in range(4)] and lock.ended == [0]
