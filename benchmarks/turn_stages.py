"""Instructions of each stage of a Claude Code turn, in-process, counted by callgrind.

    python benchmarks/turn_stages.py [--turn 60] [--stages capture,convert,…] [--src DIR] [--cjk]
                                     [--beside N] [--cpu RUNS [--cold MB]] [--misses]

One session of ``agent_turns.py`` (the traffic generator's Claude Code shape) is run
through the request path's stages in one process up to turn ``--turn`` - 1 (so the
session's memories hold what a gateway's would), then each stage is run ten times on turn
``--turn``, under ``valgrind --tool=callgrind --toggle-collect=builtin_exec*`` (only the
``exec`` that runs the stage is counted, imports done before it; the session's turns run
uninstrumented, ``--instr-atstart=no``, instrumentation switched on after them); an empty
stage's count is subtracted (``--cpu RUNS``: each stage timed instead, by
``time.process_time`` over RUNS runs, best of 5, not under valgrind; ``--misses``: its
simulated cache misses instead, each run after the caches were filled with other data,
the memory a run touches as a count no machine's load moves). ``--src`` runs another tree's sources (a checkout's ``src``): stages a tree
does not have are skipped. ``--cjk``: the session's texts not all ASCII (``agent_turns.in_cjk``), as
a team writing in Chinese sends them.

Stages: ``floor`` (msgspec decode + encode of the body), ``decode`` (the typed decode),
``decode_lent`` (the same lent by the session's previous turn, as in the gateway, then
turn - 1 again: two decodes, halved), ``decode_next`` (the turn alone after its previous
one, as in the gateway: the memory put back as it was before each run),
``convert`` (to Chat, alone), ``convert_lent`` (the same lent by the session's previous
turn: ``SessionTurns``), ``encode`` (the upstream request), ``encode_lent`` (the same lent
by the previous turn's body, as ``SessionTurns.encode``), ``segments_json`` (the record's
segment lists encoded, as the journal does), ``capture`` (segments in and
out and the change memory's comparison, of the request the gateway builds: converted
through ``SessionTurns``, as the session's turns before it; its pieces found in the
memos the first run filled), ``capture_made`` (the same with the turn's new pieces made,
as in service: the memos as they were before the turn), ``model_blocks`` (the
ledger's cache-model blocks, named as its worker names them: gone on from the session's
previous turn), ``ledger`` (the ledger worker's computation of the turn's finished
request after the session's turns before it: the cache model's path, ``model_blocks``
included), ``journal`` (the record appended to a journal: encoded and written), ``row``
(the record's row in the store, as the writer makes it), ``write`` (the writer's batch of
that one record into a SQLite store), ``ledger_write`` (one ledger written alone),
``ledgers_10`` (ten ledgers in one transaction, a tenth counted), ``write_ledger`` (the
record's batch with its ledger in the same transaction, as the writer now writes a turn's).
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPS = 10
# --misses: the simulated caches (pinned, so the counts depend on no machine), and the
# data written between runs to empty them (well past the last level)
CACHE_LL = "8388608,16,64"  # (I1 and D1 as relay_chunks.py simulates them)
COLD_MB = 24
CJK_ENV = "TURN_STAGES_CJK"


def inner(turn: int, stage: str, beside: int = 0, cpu: int = 0, cold: int = 0) -> None:
    """Run under valgrind: the session up to ``turn``, then ``stage`` REPS times (``cpu``:
    not under valgrind, ``cpu`` runs timed by ``time.process_time`` five times, the
    best and the median printed in microseconds a run)."""
    sys.path.insert(0, str(HERE))
    import agent_turns as at
    import msgspec

    from prefixgate import hygiene
    from prefixgate.apis.messages.request import ConvertOptions, convert
    from prefixgate.config import ChannelConfig, Limits
    from prefixgate.ledger.cachemodel import model_blocks
    from prefixgate.protocol.messages_body import decode_messages_body
    from prefixgate.record.capture import Capturer
    from prefixgate.record.record import Record

    (session,) = at.sessions(1, turn + 1)
    if os.environ.get(CJK_ENV):  # --cjk
        session = [(at.in_cjk(body), headers) for body, headers in session]
    sid = session[0][1]["X-Claude-Code-Session-Id"]
    ch = ChannelConfig(name="fake", base_url="http://127.0.0.1:9/v1")
    limits, cap, opts = Limits(), Capturer(), ConvertOptions("fake")

    try:  # the gateway's conversion, lent by the session's previous turn
        from prefixgate.apis.messages.request import SessionTurns

        gateway_turns = SessionTurns(1 << 30)
        converted = lambda typed, size: gateway_turns.convert(("g", sid), typed, opts, size)  # noqa: E731
    except ImportError:
        converted = lambda typed, size: convert(typed, opts)  # noqa: E731

    try:  # the gateway's learned templates, handed to the hygiene steps and the capture
        from prefixgate.engine.order import RenderOrders

        orders = RenderOrders()
        hygienic = lambda typed: hygiene.apply_typed(typed, ch, orders)  # noqa: E731
        take = lambda *args: cap(*args, orders=orders)  # noqa: E731
    except ImportError:
        hygienic = lambda typed: hygiene.apply_typed(typed, ch)  # noqa: E731
        take = cap

    import inspect

    lends = "lend" in inspect.signature(decode_messages_body).parameters
    if lends:  # the decode lent by the session's previous request, as in the gateway
        decoded = lambda raw: decode_messages_body(raw, limits, gateway_turns, lambda _: sid)  # noqa: E731
    else:
        decoded = lambda raw: decode_messages_body(raw, limits)  # noqa: E731

    def prep(k: int):
        raw = session[k][0]
        body = decoded(raw)
        typed = hygienic(body.typed)
        out = converted(typed, len(raw))
        return raw, body, typed, out, msgspec.json.encode(out)

    history = []  # each turn's record, for the ledger's stage
    for k in range(turn):
        raw, body, typed, out, data = prep(k)
        before_rec = Record(
            request_id=f"r{k}", received_at=0.0, endpoint="messages", session_id=sid
        )
        take(before_rec, body, out, ch, None, raw, data)
        history.append(before_rec)
    prev_out = out if turn else None  # turn - 1's upstream request, as the gateway made it
    raw, body, typed, out, data = prep(turn)

    def capture() -> Record:
        changes = cap.changes
        kept, size = copy.copy(changes._sessions), changes.bytes
        rec = Record(request_id="x", received_at=0.0, endpoint="messages", session_id=sid)
        take(rec, body, out, ch, None, raw, data)
        changes._sessions, changes.bytes = kept, size  # the same state every time
        return rec

    made = _made_stage(capture, max(REPS, 5 * cpu) + 2) if stage == "capture_made" else None
    rec = capture()
    stages = {
        "empty": lambda: None,
        "floor": lambda: msgspec.json.encode(msgspec.json.decode(raw)),
        "decode": lambda: decode_messages_body(raw, limits),
        "convert": lambda: convert(typed, opts),
        "encode": lambda: msgspec.json.encode(out),
        "capture": capture,
        "model_blocks": lambda: model_blocks(rec.segments_out),  # replaced below if lent
    }
    if made is not None:
        stages["capture_made"] = made
    _store_stages(stages, rec, stage, history[-1] if history else None)
    try:
        from prefixgate.apis.messages.request import SessionTurns
    except ImportError:
        pass
    else:
        turns, before = SessionTurns(1 << 30), prep(turn - 1)[2]
        turns.convert(("c", sid), before, opts, 1)

        def convert_lent() -> None:  # lent by turn - 1, then by the same again
            turns.convert(("c", sid), typed, opts, 1)
            turns.convert(("c", sid), before, opts, 1)

        stages["convert_lent"] = convert_lent
        try:
            from prefixgate.apis.messages.request import encode_lent
        except ImportError:
            pass
        else:  # the upstream body lent by turn - 1's, as SessionTurns.encode does
            lent = encode_lent(prev_out, None) if prev_out is not None else None
            stages["encode_lent"] = lambda: encode_lent(out, lent)
    try:  # the ledger's memory of the blocks segments named (its turn 59 seen)
        from prefixgate.ledger.cachemodel import BlockMemo
    except ImportError:
        pass
    else:
        memo = BlockMemo()
        model_blocks(before_rec.segments_out, memo=memo)
        stages["model_blocks"] = lambda: model_blocks(rec.segments_out, memo=memo)
    try:  # and goes on from the names of the session's turn 59, as the worker does
        from prefixgate.ledger.cachemodel import name_blocks
    except ImportError:
        pass
    else:
        named = name_blocks(before_rec.segments_out, memo=memo)
        stages["model_blocks"] = lambda: name_blocks(rec.segments_out, memo=memo, before=named)
    if lends:
        dturns, before_raw = SessionTurns(1 << 30), session[turn - 1][0]
        decode_messages_body(before_raw, limits, dturns, lambda _: sid)

        def decode_lent() -> None:  # lent by turn - 1, then by the same again
            decode_messages_body(raw, limits, dturns, lambda _: sid)
            decode_messages_body(before_raw, limits, dturns, lambda _: sid)

        stages["decode_lent"] = decode_lent
        nturns = SessionTurns(1 << 30)
        decode_messages_body(before_raw, limits, nturns, lambda _: sid)
        kept, kept_bytes = nturns._decoded.copy(), nturns.bytes

        def decode_next() -> None:  # lent by turn - 1, its memory as it was every time
            nturns._decoded, nturns.bytes = kept.copy(), kept_bytes
            decode_messages_body(raw, limits, nturns, lambda _: sid)

        stages["decode_next"] = decode_next
    others: list[list] = []  # --beside: other sessions' records, turn by turn
    for other in at.sessions(beside + 1, turn + 1)[1:] if stage == "ledger" else []:
        osid = other[0][1]["X-Claude-Code-Session-Id"]
        oturns, kept = SessionTurns(1 << 30), []
        for k in range(turn + 1):
            oraw = other[k][0]
            obody = decode_messages_body(oraw, limits)
            oout = oturns.convert(("o", osid), hygienic(obody.typed), opts, len(oraw))
            orec = Record(request_id=f"o{k}", received_at=0.0, endpoint="messages", session_id=osid)
            take(orec, obody, oout, ch, None, oraw, msgspec.json.encode(oout))
            kept.append(orec)
        others.append(kept)
    if stage == "ledger":
        ledger = _ledger_stage(ch, history, rec, others, max(REPS, 5 * cpu) + 2)
        if ledger is not None:
            stages["ledger"] = ledger
    if stage not in stages:
        print("missing", flush=True)
        return
    f = stages[stage]
    if cpu:
        import time

        f(), f()
        times = []
        if cold:  # each run after the caches were filled with other data, as in service
            sweep = bytearray(cold << 20)
            for _ in range(cpu):
                sweep[::64] = bytes(len(sweep[::64]))  # a write to every cache line
                t = time.process_time()
                f()
                times.append((time.process_time() - t) * 1e6)
            times.sort()
            n = len(times)
            print(f"{stage:<14}{times[n // 2]:>10.1f} us cold (p25 {times[n // 4]:.1f}, "
                  f"p75 {times[3 * n // 4]:.1f})", flush=True)  # fmt: skip
            return
        for _ in range(5):
            t = time.process_time()
            exec("for _ in range(RUNS): f()", {"RUNS": cpu, "f": f})
            times.append((time.process_time() - t) / cpu * 1e6)
        times.sort()
        print(f"{stage:<14}{times[0]:>10.1f} us (median {times[2]:.1f})", flush=True)
        return
    _instrument()
    f(), f()  # warm
    if cold:  # --misses: each run after the simulated caches were filled with other data
        sweep = bytearray(cold << 20)
        for _ in range(REPS):
            sweep[::64] = bytes(len(sweep[::64]))  # (not counted: outside the exec)
            exec("f()", {"f": f})  # counted
        return
    exec("for _ in range(REPS): f()", {"REPS": REPS, "f": f})  # counted


def _store_stages(stages: dict, rec, stage: str, before=None) -> None:
    """The record's way to the store: ``journal`` (its append to a journal: the line
    encoded and written), ``journal_next`` (the same after the session's previous record
    was appended, as in service: its segment lists lent, where the tree lends them),
    ``row`` (its row, as the writer makes it of the batch the
    journal's mirror hands it), ``write`` (a batch of that one record written to a SQLite
    store: the row, the transaction), ``ledger_write`` (a ledger written to it alone, as
    the ledger worker flushed each turn's), ``ledgers_10`` (ten ledgers in one
    transaction, a tenth counted) and ``write_ledger`` (the record's batch with its
    ledger, in one transaction)."""
    import atexit
    import inspect
    import shutil
    import tempfile

    import msgspec

    from prefixgate.record.journal import Journal

    tmp = tempfile.mkdtemp(prefix="turn-stages-")
    atexit.register(shutil.rmtree, tmp, True)
    journal = Journal(tmp + "/journal", segment_bytes=1 << 30)
    journal.open()
    stages["journal"] = lambda: journal.append(rec)
    journal.append(rec)
    after = Journal(tmp + "/journal-next", segment_bytes=1 << 30)
    after.open()
    if before is not None:
        after.append(before)
    lent = getattr(after, "lent", None)
    kept = (lent._kept.copy(), lent.bytes) if lent is not None else None

    def journal_next() -> None:
        if lent is not None and kept is not None:  # the memory as turn - 1 left it
            lent._kept, lent.bytes = kept[0].copy(), kept[1]
        after.append(rec)

    stages["journal_next"] = journal_next
    try:
        from prefixgate.record.journal import encode_segments_json
    except ImportError:
        pass
    else:
        buf = bytearray()
        stages["segments_json"] = lambda: encode_segments_json(
            rec.segments_in, rec.segments_out, buf
        )
    encoded = getattr(journal, "last_segments", None)
    try:
        from prefixgate.store.schema import record_row
    except ImportError:
        return
    takes = "segments" in inspect.signature(record_row).parameters
    stages["row"] = (lambda: record_row(rec, encoded)) if takes else (lambda: record_row(rec))
    if stage not in ("write", "ledger_write", "ledgers_10", "write_ledger"):
        return
    from prefixgate.store.sqlite import SqliteStore

    store = SqliteStore(tmp + "/records.db")
    store.migrate()
    ids = iter(range(1 << 30))

    def write() -> None:
        r = msgspec.structs.replace(rec, request_id=f"w{next(ids)}")
        if encoded is not None:
            store.write_batch([r], segments=[encoded])
        else:
            store.write_batch([r])

    stages["write"] = write
    try:
        from prefixgate.ledger.causes import Ledger
    except ImportError:
        return
    ledger = Ledger(
        request_id="l", received_at=0.0, source="model", prompt_tokens=12000, block_size=16,
        hit=11520, cold=480, model_predicted=11520, engine_cached=11520,
    )  # fmt: skip

    def ledgers(n: int):
        return lambda: store.write_ledgers(
            [msgspec.structs.replace(ledger, request_id=f"l{next(ids)}") for _ in range(n)]
        )

    stages["ledger_write"] = ledgers(1)
    stages["ledgers_10"] = ledgers(10)
    if "ledgers" in inspect.signature(store.write_batch).parameters:

        def write_with_ledger() -> None:  # the record and its ledger in one transaction
            i = next(ids)
            r = msgspec.structs.replace(rec, request_id=f"w{i}")
            x = msgspec.structs.replace(ledger, request_id=f"w{i}")
            store.write_batch([r], segments=[encoded], ledgers=[x])  # type: ignore[list-item]

        stages["write_ledger"] = write_with_ledger


def _made_stage(capture, runs: int):
    """``capture`` as in service: the turn's new pieces made (decoded, stripped, hashed),
    not found in the memos a run before it filled. Each call is given the memos as they
    were before the turn (``runs`` copies, made here, before the count or the timing)."""
    try:
        from prefixgate.record import cut, segments
    except ImportError:
        return None

    def copied(memo):
        new = copy.copy(memo)
        new._d = memo._d.copy()
        return new

    kept = [(copied(cut._PIECES), copied(segments.DIGESTS)) for _ in range(runs)]

    def run():
        cut._PIECES, digests = kept.pop()
        cut.DIGESTS = segments.DIGESTS = digests
        return capture()

    return run


def _ledger_stage(ch, history: list, rec, others: list[list], runs: int = REPS + 2):
    """The ledger's work on the turn's finished request (``LedgerWorker.compute`` and
    what keeps it: the model's path, a channel without engine events), each call on a
    worker of its own that computed the session's turns before (``runs`` of them, built
    before the count or the timing), so that every call finds the state the gateway's
    worker would.
    ``others``: sessions served beside it on the same replica, each turn of theirs before
    the session's same turn."""
    try:
        from prefixgate.config import parse_config
        from prefixgate.ledger.worker import LedgerWorker
    except ImportError:
        return None
    config = parse_config({"channels": [{"name": ch.name, "base_url": ch.base_url}], "store": None})

    def served(r):  # as the gateway finishes it: the fake upstream's usage
        r.channel, r.replica = ch.name, ch.base_url
        r.prompt_tokens, r.cached_tokens = 12000, 11520
        return r

    def run(w, r) -> None:
        c = w.compute(r, None, None)
        try:
            c.send(None)  # the model's path awaits nothing
        except StopIteration as stop:
            if stop.value is not None:
                w._done(stop.value, ch.name)
        else:
            raise SystemExit("the ledger's compute waited")

    before = []
    for k, r in enumerate(history):
        before += [o[k] for o in others] + [r]
    before += [o[len(history)] for o in others]
    for r in (*before, rec):
        served(r)
    workers = []
    for _ in range(runs):
        w = LedgerWorker(config)
        for r in before:
            run(w, r)
        workers.append(w)
    left = iter(workers)
    return lambda: run(next(left), rec)


def _instrument() -> None:
    """Valgrind runs the session's turns uninstrumented (``--instr-atstart=no``, several
    times faster): instrumentation is switched on here, once they are done. The process
    keeps running Python until ``callgrind_control`` is answered (valgrind reads the
    command between basic blocks; a process blocked in a wait would never let it)."""
    if not os.environ.get("TURN_STAGES_UNDER_VALGRIND"):
        return
    ctl = subprocess.Popen(["callgrind_control", "-i", "on", str(os.getpid())],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    while ctl.poll() is None:
        sum(range(1000))


def count(
    turn: int, stage: str, src: Path | None, beside: int = 0, misses: bool = False
) -> float | dict[str, float] | None:
    """The instructions a run of ``stage`` (``misses``: its simulated cache misses, each
    run cold: a dict of Ir, D1 and LL data misses, I1 misses, a run)."""
    env = {**os.environ, "TURN_STAGES_UNDER_VALGRIND": "1"}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
               "--toggle-collect=builtin_exec*",
               f"--callgrind-out-file={tmp}/out"]  # fmt: skip
        if misses:
            cmd += ["--cache-sim=yes", f"--I1={_relay_chunks().CACHE_L1}",
                    f"--D1={_relay_chunks().CACHE_L1}", f"--LL={CACHE_LL}"]  # fmt: skip
        cmd += [sys.executable, __file__, "--inner", "--turn", str(turn), "--stages", stage,
                "--beside", str(beside), "--cold", str(COLD_MB if misses else 0)]  # fmt: skip
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if "missing" in done.stdout:
            return None
        if misses:
            got = _relay_chunks().parse_dump(Path(f"{tmp}/out").read_text())
            return {
                "Ir": got["Ir"] / REPS,
                "D1": (got["D1mr"] + got["D1mw"]) / REPS,
                "LL": (got["DLmr"] + got["DLmw"]) / REPS,
                "I1": got["I1mr"] / REPS,
            }
    m = re.search(r"Collected : (\d+)", done.stderr)
    if m is None:
        raise SystemExit(f"no count from valgrind:\n{done.stderr[-2000:]}")
    return int(m.group(1)) / REPS


def _relay_chunks():
    """relay_chunks.py (its simulated caches and its reading of a callgrind dump), imported
    only where --misses needs it: the plain count does not load its imports."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import relay_chunks

    return relay_chunks


def _runs_in(stage: str) -> int:
    """How many of its turns a stage's run holds (a ``_lent`` stage's: two, see above)."""
    return 2 if stage.endswith("_lent") else 10 if stage.endswith("_10") else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turn", type=int, default=60)
    ap.add_argument(
        "--stages",
        default="floor,decode,decode_lent,convert,convert_lent,encode,capture,model_blocks,ledger",
    )
    ap.add_argument("--src", type=Path, help="another tree's src directory")
    ap.add_argument(
        "--beside",
        type=int,
        default=0,
        help="the ledger stage: this many other sessions served on the same replica, "
        "each turn of theirs before the session's same turn",
    )
    ap.add_argument(
        "--cpu",
        type=int,
        default=0,
        metavar="RUNS",
        help="time each stage instead (time.process_time over RUNS runs, best of 5, in "
        "microseconds; not under valgrind)",
    )
    ap.add_argument(
        "--cold",
        type=int,
        default=0,
        metavar="MB",
        help="with --cpu: time each run alone, after writing to every cache line of MB "
        "megabytes of other data (a turn's data has left the caches by the next turn in "
        "service); the median run, in microseconds",
    )
    ap.add_argument(
        "--cjk",
        action="store_true",
        help="the session's texts not all ASCII: each ' the ' written as a Chinese word",
    )
    ap.add_argument(
        "--misses",
        action="store_true",
        help="count each stage's simulated cache misses instead, each run after the "
        f"caches were filled with {COLD_MB} MB of other data (as --cold): the memory a "
        "turn touches, as a count no machine's load moves",
    )
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cpu-inner", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cjk:
        os.environ[CJK_ENV] = "1"  # the inner runs' environment (under valgrind too)
    if args.inner or args.cpu_inner:
        inner(args.turn, args.stages, args.beside, args.cpu_inner, args.cold)
        return
    if args.cpu:
        env = {**os.environ}
        if args.src is not None:
            env["PYTHONPATH"] = str(args.src)
        for stage in args.stages.split(","):
            cmd = [sys.executable, __file__, "--cpu-inner", str(args.cpu), "--turn",
                   str(args.turn), "--stages", stage, "--beside", str(args.beside),
                   "--cold", str(args.cold)]  # fmt: skip
            subprocess.run(cmd, env=env, check=True)
        return
    if args.misses:
        base = count(args.turn, "empty", args.src, args.beside, misses=True)
        assert isinstance(base, dict)
        print(f"turn {args.turn}: a stage's run, cold (callgrind's simulated caches: "
              f"LL {CACHE_LL}, after {COLD_MB} MB written)")  # fmt: skip
        print(f"{'stage':<14}{'M instr':>10}{'D1 misses':>12}{'LL misses':>12}{'I1 misses':>12}")
        for stage in args.stages.split(","):
            got = count(args.turn, stage, args.src, args.beside, misses=True)
            if got is None:
                print(f"{stage:<14}{'(not in this tree)':>20}")
                continue
            assert isinstance(got, dict)
            d = {k: (got[k] - base[k]) / _runs_in(stage) for k in got}
            print(f"{stage:<14}{d['Ir'] / 1e6:>10.2f}{d['D1']:>12,.0f}{d['LL']:>12,.0f}"
                  f"{d['I1']:>12,.0f}", flush=True)  # fmt: skip
        return
    empty = count(args.turn, "empty", args.src, args.beside)
    print(f"turn {args.turn}: M instructions a stage (callgrind)")
    for stage in args.stages.split(","):
        got = count(args.turn, stage, args.src, args.beside)
        if got is None:
            print(f"{stage:<14}{'(not in this tree)':>20}")
            continue
        per = (got - empty) / _runs_in(stage)
        print(f"{stage:<14}{per / 1e6:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
