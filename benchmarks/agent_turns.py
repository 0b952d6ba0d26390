"""An agent turn at the cost of reading it: the gateway's CPU per real-size Claude Code turn.

    python benchmarks/agent_turns.py [--sessions 4] [--turns 64] [--settle 0.7]
                                     [--only NAME,…] [--no-litellm] [--json]
                                     [--ref REF] [--paired] [--cjk] [--reminders] [--codex]

The bodies come from the project's own traffic generator (``prefixgate.lab.traffic``), in
Claude Code's shape: ``--sessions`` sessions of ``--turns`` turns each (tools, the billing
header, a mid-conversation system message, thinking blocks, code pastes and tool results,
the moving ``cache_control`` marker), growing from ~80 KB past 300 KB, no compaction.
``--cjk``: their texts not all ASCII, as a team writing in Chinese sends them (each
" the " a Chinese word: :func:`in_cjk`). ``--reminders``: Claude Code's ``<total_tokens>``
reminder on (a system message after each user message: :func:`with_reminders`), the
channel delivering them in the client's turns (``system_in_place: true``, as on a
template that gathers system messages at the head). ``--codex``: the same conversations
as Codex CLI sends them (:func:`~prefixgate.lab.traffic.codex.as_codex`), to ``/v1/responses``: the gateway's Responses
path, converted to Chat Completions upstream (LiteLLM is not run then).
They go to ``/v1/messages`` as streams, one request at a time, turn k of every session
before turn k + 1 of any, through the gateway to a fast fake upstream
(``overhead_upstream.py``: a 4-chunk stream at once).

Placement: the gateway is one process (one worker) pinned to core 0; the upstream and
this process (the client) share core 1. Each subject starts afresh and is warmed up by a
session of its own first. The subjects run one after another; under ``--paired`` they are
all started at once and take the turns side by side (turn k of every session to each in
turn, the order rotating with k), so that a machine whose speed drifts over the run moves
them alike: the way to compare two trees (``--ref``) or two settings.

Subjects: ``defaults`` (SQLite store, segment capture, change shapes, ledger, journal),
then each feature off alone (``no-ledger``, ``no-changes``: ``change_memory_mb: 0``,
``no-capture``: ``capture_segments: false``, ``no-journal``, ``no-store``), and the LiteLLM
proxy when ``overhead.py`` has installed it (``~/.cache/prefixgate/litellm-<version>``).
And ``bare-relay``: the same turns through ``overhead_floor.py`` (a proxy that relays the
request's and the answer's bytes and nothing else, busy-polling as the gateway's defaults do),
measured the same way: the physical floor of an HTTP hop carrying these bodies (its
socket reads and writes, the loop's wake-ups), which the in-process floor below does not
pay. The floor a gateway is held to is then the bare relay's plus the in-process decode +
encode: the ``x (relay + decode)`` column.

Figures by turn index: the gateway's CPU per turn, user + system of every thread of the
process tree from ``/proc/<pid>/task/*/schedstat`` (nanoseconds), read before turn k of
the first session and ``--settle`` seconds after turn k of the last, so that the work
done after the answer (the capture on the loop's next turn, the record writer's batch,
the ledger) counts, minus the process's idle CPU over the same time (measured first);
divided by the sessions. Time to last byte: the client's, from the first byte written to
the end of the answer. The floor: ``msgspec.json.decode`` + ``msgspec.json.encode`` of the
same bodies in this process (the least any Python gateway that reads a body and writes
one can do), and SHA-256 of each body once, both by ``time.process_time``; best of 5.
The whole run's user and system seconds apart, from ``/proc/<pid>/stat`` (under
``--paired`` they span the other subjects' turns too); and the CPU a turn by thread, read
in the same windows as the CPU a turn (each minus its idle share, the two adding up to
it): the event loop's (each process's main thread) and the others' (the record writer's,
the ledgers').

Under ``--count``, the in-process floor is counted too: ``msgspec.json.decode`` + ``encode``
of each body and freeing the decoded document, in a process of its own under callgrind
(one dump per body).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as ov  # noqa: E402
import overhead_load as load  # noqa: E402
from overhead_upstream import Running  # noqa: E402

from prefixgate.config.server import ServerConfig  # noqa: E402
from prefixgate.lab.traffic.claude_code import ClaudeCodeSession  # noqa: E402
from prefixgate.lab.traffic.codex import as_codex  # noqa: E402
from prefixgate.lab.traffic.spec import AGENT_CLAUDE_CODE, TrafficSpec  # noqa: E402
from prefixgate.lab.traffic.template_sessions import TOTAL_TOKENS  # noqa: E402

# subject -> what its config changes from the defaults (None: no store at all)
SUBJECTS: dict[str, dict | None] = {
    "defaults": {},
    "no-ledger": {"ledger": False},
    "no-changes": {"change_memory_mb": 0},
    "no-capture": {"capture_segments": False},
    "no-journal": {"journal_path": None},
    "no-store": None,
    # the record alone: its row (and its writer), then with the journal too
    "row-only": {"capture_segments": False, "ledger": False, "journal_path": None},
    "row-journal": {"capture_segments": False, "ledger": False},
}
RELAY = "bare-relay"  # the HTTP hop alone: overhead_floor.py
COUNT_SETTLE = 3.0  # seconds under valgrind for the work a turn leaves for later
WINDOW = 2  # turns either side of an index whose figures are averaged ("turn 10": 8..12)


def in_cjk(body: bytes) -> bytes:
    """``--cjk``: a body whose texts are not all ASCII, as a team writing in Chinese sends
    (each " the " of its texts written as a Chinese word, the same in every turn, so that
    a turn is still its previous one and a tail; JSON keys hold no spaces)."""
    return body.replace(b" the ", " 这个 ".encode())


def with_reminders(body: bytes) -> bytes:
    """``--reminders``: the body with Claude Code's ``<total_tokens>`` reminder on: a
    ``role: system`` message after each user message (a prompt or tool results), the
    tokens left in it, the earlier ones unchanged from turn to turn."""
    req = msgspec.json.decode(body)
    messages = []
    for m in req["messages"]:
        messages.append(m)
        if m["role"] == "user":
            left = 1_000_000 - 997 * len(messages)
            messages.append({"role": "system", "content": TOTAL_TOKENS.format(n=left)})
    req["messages"] = messages
    return msgspec.json.encode(req)


def sessions(
    n: int,
    turns: int,
    seed: int = 0,
    cjk: bool = False,
    reminders: bool = False,
    codex: bool = False,
) -> list[list[tuple[bytes, dict]]]:
    """``n`` Claude Code sessions of ``turns`` turns: per session, (body, headers) a turn
    (``cjk``: their texts as :func:`in_cjk` writes them; ``reminders``: with
    :func:`with_reminders`; ``codex``: as Codex CLI sends them, :func:`~prefixgate.lab.traffic.codex.as_codex`)."""
    spec = TrafficSpec(
        sessions=n,
        turns=turns,
        seed=seed,
        titles=False,
        compact_chars=0,
        models=("fake",),
        mix={AGENT_CLAUDE_CODE: 1.0},
    )
    out = []
    for i in range(n):
        s = ClaudeCodeSession(spec, seed * 1000 + i)
        turned = [(r.content(), r.headers) for r in s.requests() if r.kind == "turn"]
        if reminders:
            turned = [(with_reminders(b), h) for b, h in turned]
        if codex:
            turned = [as_codex(b, h) for b, h in turned]
        out.append([(in_cjk(b), h) for b, h in turned] if cjk else turned)
    return out


def floor_ms(bodies: list[bytes]) -> tuple[list[float], list[float]]:
    """Per body: msgspec decode + encode, and SHA-256, in CPU ms (best of 5)."""
    dec, enc = msgspec.json.decode, msgspec.json.encode
    parse, digest = [], []
    for b in bodies:
        best = best_h = float("inf")
        for _ in range(5):
            t0 = time.process_time()
            enc(dec(b))
            t1 = time.process_time()
            hashlib.sha256(b).digest()
            t2 = time.process_time()
            best, best_h = min(best, t1 - t0), min(best_h, t2 - t1)
        parse.append(1000 * best)
        digest.append(1000 * best_h)
    return parse, digest


def run_ns_split(pid: int) -> tuple[int, int]:
    """CPU nanoseconds (user + system) of every thread of ``pid``'s process tree, as (the
    main threads' — each process's event loop —, the other threads': the record writer's,
    the ledgers')."""
    main = other = 0
    for p in ov.tree(pid):
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/schedstat") as f:
                    ns = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            if t == str(p):
                main += ns
            else:
                other += ns
    return main, other


async def idle_rates(pid: int, seconds: float = 2.0) -> tuple[float, float]:
    """The process's CPU ns per wall second while nothing is asked of it, by
    :func:`run_ns_split`'s two parts."""
    c0, t0 = run_ns_split(pid), time.perf_counter()
    await asyncio.sleep(seconds)
    c1, dt = run_ns_split(pid), time.perf_counter() - t0
    return (c1[0] - c0[0]) / dt, (c1[1] - c0[1]) / dt


async def send(conn, raw: bytes) -> tuple[float, float]:
    """One request on a kept-alive connection; again on a new one if the gateway had
    closed it (its keep-alive timeout, slower under valgrind)."""
    try:
        return await conn.request(raw)
    except (asyncio.IncompleteReadError, ConnectionError) as err:
        if isinstance(err, asyncio.IncompleteReadError) and err.partial:
            raise
        conn.drop()
        return await conn.request(raw)


def _request(url: str, body: bytes, headers: dict, key: str | None) -> bytes:
    h = {k: v for k, v in headers.items() if k.lower() not in ("content-type", "x-api-key")}
    h["x-api-key"] = key or headers.get("x-api-key", "")
    path = "/v1/responses" if h.get("originator") == "codex_exec" else "/v1/messages?beta=true"
    return load.build_request(url + path, body, h)[2]


async def measure(
    url: str, pid: int, convo, warm, settle: float, key: str | None, profiled: bool = False
) -> dict:
    """One gateway's CPU and times to last byte, turn by turn (:func:`measure_paired` of
    it alone)."""
    return (await measure_paired([(url, pid, key)], convo, warm, settle, profiled))[0]


async def measure_paired(
    gws: list[tuple[str, int, str | None]], convo, warm, settle: float, profiled: bool = False
) -> list[dict]:
    """Several gateways (url, pid, key) side by side: all warmed up first, then turn k of
    every session sent to each in turn (the order rotating with k), each turn index's CPU
    read from that gateway alone, minus its idle share. What moves the machine during the
    run (other load, the clock, the caches) moves every subject alike, so their ratios
    hold where sequential runs drift apart. ``profiled``: the gateways run under
    pyprofile.py or pyops.py, told to forget the start-up and the warm-up."""
    conns = []
    for url, _, key in gws:
        host, port = url.rsplit("/", 1)[1].split(":")
        conn = load._Conn(host, int(port))
        for body, headers in warm:
            await send(conn, _request(url, body, headers, key))
        conns.append(conn)
    await asyncio.sleep(settle)
    pids = [pid for _, pid, _ in gws]
    if profiled:
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)
    rates = await asyncio.gather(*(idle_rates(pid) for pid in pids))
    times0 = [ov.cpu_times(pid) for pid in pids]
    cpu: list[list[float]] = [[] for _ in gws]
    own = [[0.0, 0.0] for _ in gws]  # by thread, within each gateway's own windows
    ttlb: list[list[list[float]]] = [[] for _ in gws]
    n = len(gws)
    for k in range(len(convo[0])):
        for j in range(n):
            i = (j + k) % n
            url, pid, key = gws[i]
            c0, t0 = run_ns_split(pid), time.perf_counter()
            lat = []
            for turns in convo:
                body, headers = turns[k]
                lat.append((await send(conns[i], _request(url, body, headers, key)))[0])
            await asyncio.sleep(settle)
            c1, dt = run_ns_split(pid), time.perf_counter() - t0
            parts = [c1[t] - c0[t] - rates[i][t] * dt for t in range(2)]
            for t in range(2):
                own[i][t] += parts[t]
            cpu[i].append(sum(parts) / 1e6 / len(convo))
            ttlb[i].append([1000 * v for v in lat])
    turns = len(convo) * len(convo[0])
    out = []
    for i, pid in enumerate(pids):
        user1, sys1 = ov.cpu_times(pid)
        conns[i].drop()
        out.append(
            {
                # CPU a turn by thread, in the gateway's own windows, each minus its idle
                # share: the two add up to its CPU a turn
                "threads_ms": [own[i][t] / 1e6 / turns for t in range(2)],
                "cpu_ms": cpu[i],
                "ttlb_ms": ttlb[i],
                "idle_ms_per_s": sum(rates[i]) / 1e6,
                "user_s": user1 - times0[i][0],
                "system_s": sys1 - times0[i][1],
            }
        )
    return out


def config_for(name: str, port: int, upstream: str, work: Path) -> dict:
    change = SUBJECTS[name]
    cfg = ov.gateway_config(port, upstream, None if change is None else work, name)
    # No load shedding: the cost of a turn is measured, not an overload (on a shared
    # machine, or under valgrind, the loop runs late for reasons not the gateway's).
    cfg["server"]["shed_loop_lag"] = None
    if change:
        cfg["store"].update(change)
    return cfg


class Subject(ov.Gateway):
    """A gateway of :data:`SUBJECTS` (its config written here; ``NAME@ref``: the sources
    in ``src``), or ``litellm``."""

    src: Path | None = None
    # --profile / --opcodes: the gateway run by benchmarks/pyprofile.py or pyops.py, which
    # writes what it counted to the path
    under: tuple[str, Path] | None = None
    reminders = False  # --reminders: the channel delivers later system messages in place

    def command(self):
        if self.name == "litellm":
            return super().command()
        if self.name == RELAY:
            port = self.upstream.rsplit(":", 1)[1]
            cmd = [sys.executable, str(ROOT / "benchmarks" / "overhead_floor.py")]
            cmd += ["--port", str(self.port), "--upstream-port", port]
            poll = str(ServerConfig().busy_poll_us)  # as the gateway's defaults poll
            return [*cmd, "--busy-poll-us", poll], dict(os.environ), "/health"
        base = self.name.split("@")[0]
        cfg = self.work / "config.json"
        config = config_for(base, self.port, self.upstream, self.work)
        if self.reminders:
            config["channels"][0]["system_in_place"] = True
        cfg.write_text(json.dumps(config))
        env = dict(os.environ)
        if self.src is not None:
            env["PYTHONPATH"] = str(self.src)
        cmd = [sys.executable, "-m", "prefixgate.cli", "serve", "--config", str(cfg)]
        if self.under is not None:
            tool, out = self.under
            cmd[1:1] = [str(ROOT / "benchmarks" / tool), str(out)]
        return [*cmd, "--log-level", "warning"], env, "/healthz"

    def start(self) -> None:
        for _ in range(3):
            cmd, env, health = self.command()
            self.log = open(self.work / "gateway.log", "ab")  # noqa: SIM115
            self.proc = subprocess.Popen(
                cmd,
                env=env,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                preexec_fn=ov.pinned(ov.GATEWAY_CPU),
            )
            try:
                ov.wait_http(self.url + health, self.proc)
                time.sleep(0.5)
                if self.proc.poll() is None:
                    return
            except SystemExit:
                pass
            # the port was taken meanwhile (a shared machine): another one
            self.stop()
            self.port = ov.free_port()
            self.url = f"http://127.0.0.1:{self.port}"
        raise SystemExit(f"{self.name} did not start (see {self.work / 'gateway.log'})")


def at(values: list[float], k: int) -> float:
    """The mean of ``values`` over turns ``k - WINDOW .. k + WINDOW`` (those that exist)."""
    part = values[max(0, k - WINDOW) : k + WINDOW + 1]
    return sum(part) / len(part)


def summarize(name: str, m: dict, floor: list[float]) -> dict:
    cpu = m["cpu_ms"]
    above = [c - f for c, f in zip(cpu, floor, strict=True)]
    flat = [v for row in m["ttlb_ms"] for v in row]
    n = len(cpu)
    out = {
        "subject": name,
        "cpu_ms_mean": statistics.fmean(cpu),
        "cpu_ms_median": statistics.median(cpu),
        "ttlb_ms_p50": statistics.median(flat),
        "user_s": m["user_s"],
        "system_s": m["system_s"],
        "idle_ms_per_s": m["idle_ms_per_s"],
        "loop_thread_ms": m["threads_ms"][0] if "threads_ms" in m else None,
        "other_threads_ms": m["threads_ms"][1] if "threads_ms" in m else None,
        "by_turn": {
            str(k): {
                "cpu_ms": at(cpu, k),
                "above_floor_ms": at(above, k),
                "ttlb_ms_p50": statistics.median(
                    v for row in m["ttlb_ms"][max(0, k - WINDOW) : k + WINDOW + 1] for v in row
                ),
            }
            for k in marks(n)
        },
        "cpu_ms": cpu,
    }
    t10, t60 = out["by_turn"].get("10"), out["by_turn"].get(str(min(60, n - 1 - WINDOW)))
    if t10 and t60 and t10["above_floor_ms"] > 0:
        out["above_floor_60_over_10"] = t60["above_floor_ms"] / t10["above_floor_ms"]
    return out


def marks(n: int) -> list[int]:
    return [k for k in (1, 10, 20, 30, 40, 50, 60) if k < n - WINDOW] or [n // 2]


async def run(args) -> dict:
    os.sched_setaffinity(0, {ov.LOAD_CPU})
    shape = {"cjk": args.cjk, "reminders": args.reminders, "codex": args.codex}
    convo = sessions(args.sessions, args.turns, **shape)
    warm = sessions(1, args.warm_turns, seed=1, **shape)[0]
    Subject.reminders = args.reminders
    sizes = [len(b) for s in convo for b, _ in s]
    parse, digest = floor_ms([b for s in convo for b, _ in s])
    per_turn = len(convo[0])
    floor = [
        statistics.fmean(parse[i * per_turn + k] for i in range(len(convo)))
        for k in range(per_turn)
    ]
    hashed = [
        statistics.fmean(digest[i * per_turn + k] for i in range(len(convo)))
        for k in range(per_turn)
    ]
    result = {
        "sessions": len(convo),
        "turns": per_turn,
        "codex": args.codex,
        "body_kb": {
            "median": statistics.median(sizes) / 1000,
            "max": max(sizes) / 1000,
            "first": min(sizes) / 1000,
            "by_turn": {
                str(k): statistics.fmean(len(s[k][0]) for s in convo) / 1000
                for k in marks(per_turn)
            },
        },
        "floor": {
            "decode_encode_ms_mean": statistics.fmean(floor),
            "decode_encode_ms_median": statistics.median(floor),
            "sha256_ms_mean": statistics.fmean(hashed),
            "by_turn": {str(k): at(floor, k) for k in marks(per_turn)},
            "per_turn_ms": floor,
        },
        "subjects": [],
    }
    names = [n for n in SUBJECTS if not args.only or n in args.only]
    if args.ref:  # the commit before, each subject right after this tree's
        names = [m for n in names for m in (n, f"{n}@{args.ref}")]
    if not args.only or RELAY in args.only:
        names.insert(0, RELAY)
    litellm = Path.home() / ".cache" / "prefixgate" / f"litellm-{args.litellm_version}"
    litellm = litellm / "bin" / "litellm"
    if (
        not args.count
        and not args.no_litellm
        and not args.codex
        and litellm.exists()
        and (not args.only or "litellm" in args.only)
    ):
        names.append("litellm")
    if args.count:
        counted = floor_instructions([b for s in convo for b, _ in s])
        result["floor"]["instructions"] = [
            statistics.fmean(counted[i * per_turn + k] for i in range(len(convo)))
            for k in range(per_turn)
        ]
    ref_src = worktree(args.ref) / "src" if args.ref else None
    try:
        with Running(ov.LOAD_CPU) as up, tempfile.TemporaryDirectory(prefix="agent-turns-") as tmp:
            if getattr(args, "paired", False) and not args.count:
                await _paired(args, names, up.url, Path(tmp), ref_src, convo, warm, floor, result)
                return result
            for name in names:
                print(f"{name} …", file=sys.stderr, flush=True)
                gw = _subject(args, name, up.url, Path(tmp), ref_src)
                if args.count:
                    m = await count(gw, convo, warm, getattr(args, "keep", None))
                    result["subjects"].append({"subject": name, **m})
                    continue
                gw.start()
                try:
                    key = ov.KEY if name == "litellm" else None
                    m = await measure(
                        gw.url,
                        gw.proc.pid,
                        convo,
                        warm,
                        args.settle,
                        key,
                        gw.under is not None,
                    )
                finally:
                    gw.stop()
                result["subjects"].append({**summarize(name, m, floor), **stored_lists(gw)})
                done = {k: v for k, v in result["subjects"][-1].items() if k != "cpu_ms"}
                print(json.dumps(done), file=sys.stderr, flush=True)  # a long run's progress
    finally:
        if ref_src is not None:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(ref_src.parent)],
                check=False,
            )
    return result


def _subject(args, name: str, upstream: str, tmp: Path, ref_src: Path | None) -> Subject:
    """The subject ``name``, its work directory in ``tmp`` (``NAME@ref``: the sources in
    ``ref_src``; with ``--profile`` or ``--opcodes``, the tool it runs under and its file)."""
    work = tmp / name
    work.mkdir()
    gw_args = SimpleNamespace(workers=1, litellm_version=args.litellm_version)
    gw = Subject(name, work, upstream, gw_args)
    gw.src = ref_src if "@" in name else None
    for tool, where, suffix in (
        ("pyprofile.py", "profile", "pstats"),
        ("pyops.py", "opcodes", "json"),
    ):
        folder = getattr(args, where, None)
        if folder is not None and name not in ("litellm", RELAY):
            folder.mkdir(parents=True, exist_ok=True)
            gw.under = (tool, folder / f"{name}.{suffix}")
            break
    return gw


async def _paired(args, names, upstream: str, tmp: Path, ref_src, convo, warm, floor, result):
    """``--paired``: every subject started at once and measured side by side."""
    gws = []
    try:
        for name in names:
            gw = _subject(args, name, upstream, tmp, ref_src)
            gw.start()
            gws.append(gw)
        print(f"{', '.join(names)} side by side …", file=sys.stderr, flush=True)
        ms = await measure_paired(
            [(gw.url, gw.proc.pid, ov.KEY if gw.name == "litellm" else None) for gw in gws],
            convo,
            warm,
            args.settle,
            any(gw.under is not None for gw in gws),
        )
    finally:
        for gw in gws:
            gw.stop()
    for gw, m in zip(gws, ms, strict=True):
        result["subjects"].append({**summarize(gw.name, m, floor), **stored_lists(gw)})
    result["paired"] = True


def stored_lists(gw: Subject) -> dict:
    """What the subject's store holds of the segment lists (its SQLite file, read after
    the gateway stopped): KB of their JSON a record, warm-up included; {} without one."""
    db = gw.work / f"{gw.name.split('@')[0]}.db"
    if not db.exists():
        return {}
    with contextlib.closing(sqlite3.connect(db)) as conn:
        n, size = conn.execute(
            "SELECT COUNT(*), SUM(LENGTH(segments_in)) + SUM(COALESCE(LENGTH(segments_out), 0))"
            " FROM requests"
        ).fetchone()
    return {"lists_kb": (size or 0) / max(n, 1) / 1024}


def worktree(ref: str) -> Path:
    """``ref`` checked out into a temporary worktree (its sources run as ``NAME@ref``)."""
    path = Path(tempfile.mkdtemp(prefix="prefixgate-ref-")) / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), ref], check=True
    )
    return path


async def count(gw: Subject, convo, warm, keep: Path | None = None) -> dict:
    """Instructions (valgrind's callgrind, user space, every thread) of the gateway per
    turn, by turn index: counting on from the first measured turn, one dump (which also
    zeroes the counters) after each turn index's requests and ``COUNT_SETTLE`` seconds for
    the work they leave for later; minus the instructions of an idle window as long."""
    cmd, env, health = gw.command()
    prefix = gw.work / "callgrind.out"
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
           f"--callgrind-out-file={prefix}", *cmd]  # fmt: skip
    log = open(gw.work / "valgrind.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)

    def control(*what: str) -> None:
        subprocess.run(["callgrind_control", *what, str(proc.pid)], capture_output=True, check=True)

    dumps = 0

    async def dump() -> int:
        nonlocal dumps
        control("--dump")
        dumps += 1
        for _ in range(600):
            found = list(gw.work.glob(f"callgrind.out.{proc.pid}.{dumps}")) or list(
                gw.work.glob(f"callgrind.out.{dumps}")
            )
            if found and "totals:" in found[0].read_text(errors="replace")[-4000:]:
                if keep is not None:
                    keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(found[0], keep / f"{gw.name}.{dumps}")
                return _collected(found[0])
            await asyncio.sleep(0.1)
        raise SystemExit("callgrind wrote no dump")

    try:
        ov.wait_http(gw.url + health, proc, timeout=600)
        host, port = gw.url.rsplit("/", 1)[1].split(":")
        conn = load._Conn(host, int(port))
        for body, headers in warm:
            await send(conn, _request(gw.url, body, headers, None))
        await asyncio.sleep(COUNT_SETTLE)
        control("-i", "on")
        await dump()  # zeroed
        await asyncio.sleep(COUNT_SETTLE)
        idle = await dump()
        per_turn = []
        for k in range(len(convo[0])):
            for turns in convo:
                body, headers = turns[k]
                await send(conn, _request(gw.url, body, headers, None))
            await asyncio.sleep(COUNT_SETTLE)
            per_turn.append((await dump() - idle) / len(convo))
        conn.drop()
    finally:
        ov.stop(proc)
        log.close()
    return {"instructions": per_turn, "idle_instructions": idle}


_FLOOR_COUNTED = """
import sys
import msgspec
dec, enc = msgspec.json.decode, msgspec.json.encode
with open(sys.argv[1], "rb") as f:
    data = memoryview(f.read())
at = 0
while at < len(data):
    n = int.from_bytes(data[at : at + 8], "little")
    enc(dec(data[at + 8 : at + 8 + n]))
    at += 8 + n
dec(b"0")
"""


def floor_instructions(bodies: list[bytes]) -> list[int]:
    """Per body: the instructions of ``msgspec.json.decode`` + ``encode`` of it and of
    freeing what the decode made (as ``turn_stages.py --stages floor`` counts it), in a
    process of its own under callgrind: one dump before each decode (nothing else in that
    process decodes), so that the dump after body i's holds body i's work and the loop's
    few steps (the bodies are views of one buffer, not copies)."""
    with tempfile.TemporaryDirectory(prefix="agent-turns-floor-") as tmp:
        path = Path(tmp) / "bodies"
        path.write_bytes(b"".join(len(b).to_bytes(8, "little") + b for b in bodies))
        cmd = ["valgrind", "--tool=callgrind", "--dump-before=msgspec_json_decode",
               f"--callgrind-out-file={tmp}/out",
               sys.executable, "-c", _FLOOR_COUNTED, str(path)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        dumps = sorted(Path(tmp).glob("out.*"), key=lambda d: int(d.suffix[1:]))
        if done.returncode != 0 or len(dumps) != len(bodies) + 1:
            raise SystemExit(f"the floor was not counted:\n{done.stderr[-2000:]}")
        return [_collected(d) for d in dumps[1:]]


def _collected(path: Path) -> int:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    return 0


def relay_floor(r: dict, key: str) -> list[float] | None:
    """Per turn: the bare relay's ``key`` figure plus the in-process decode + encode's
    (``cpu_ms`` against the timed floor, ``instructions`` against the counted one); None
    when the bare relay was not run."""
    relay = next((s for s in r["subjects"] if s["subject"] == RELAY), None)
    if relay is None:
        return None
    decode = r["floor"]["instructions" if key == "instructions" else "per_turn_ms"]
    return [a + b for a, b in zip(relay[key], decode, strict=True)]


def count_table(r: dict) -> str:
    ks = list(r["body_kb"]["by_turn"])
    both = relay_floor(r, "instructions")
    lines = [
        f"{r['sessions']} sessions x {r['turns']} turns"
        + (" in Codex CLI's shape (/v1/responses)" if r.get("codex") else "")
        + "; M instructions a turn (callgrind), "
        "by turn index (mean of turns k-2..k+2)",
        f"{'subject':<22}{'mean':>8}"
        + "".join(f"{k:>8}" for k in ks)
        + f"{'x (relay + decode)':>20}",
    ]
    rows = [(s["subject"], s["instructions"]) for s in r["subjects"]]
    rows.append(("decode + encode", r["floor"]["instructions"]))
    if both is not None:
        rows.append(("floor: relay + decode", both))
    for name, ins in rows:
        cells = "".join(f"{at(ins, int(k)) / 1e6:>8.2f}" for k in ks)
        ratio = "" if both is None else f"{statistics.fmean(ins) / statistics.fmean(both):.2f}"
        lines.append(f"{name:<22}{statistics.fmean(ins) / 1e6:>8.2f}{cells}{ratio:>20}")
    return "\n".join(lines)


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


def table(r: dict) -> str:
    if r["subjects"] and "instructions" in r["subjects"][0]:
        return count_table(r)
    f = r["floor"]
    b = r["body_kb"]
    both = relay_floor(r, "cpu_ms")
    both_mean = None if both is None else statistics.fmean(both)
    lines = [
        f"{r['sessions']} sessions x {r['turns']} turns"
        + (" in Codex CLI's shape (/v1/responses)" if r.get("codex") else "")
        + f"; bodies {b['first']:.0f}-{b['max']:.0f} KB, median {b['median']:.0f} KB"
        + ("; the subjects side by side" if r.get("paired") else ""),
        f"floor (msgspec decode + encode, in-process): {f['decode_encode_ms_mean']:.3f} ms a turn "
        f"(median {f['decode_encode_ms_median']:.3f}); sha256 once: {f['sha256_ms_mean']:.3f} ms",
        "",
        f"{'subject':<12}{'CPU ms/turn':>12}{'median':>8}{'x floor':>8}"
        f"{'x (relay + decode)':>20}{'TTLB p50':>10}"
        f"{'60/10 above floor':>19}{'user s':>8}{'sys s':>7}{'loop thread':>13}{'others':>8}"
        f"{'lists KB':>10}",
    ]
    for s in r["subjects"]:
        ratio = s.get("above_floor_60_over_10")
        hop = "" if both_mean is None else f"{s['cpu_ms_mean'] / both_mean:.2f}"
        lines.append(
            f"{s['subject']:<12}{s['cpu_ms_mean']:>12.2f}{s['cpu_ms_median']:>8.2f}"
            f"{s['cpu_ms_mean'] / f['decode_encode_ms_mean']:>8.1f}{hop:>20}"
            f"{s['ttlb_ms_p50']:>10.2f}"
            f"{'' if ratio is None else f'{ratio:.2f}':>19}{s['user_s']:>8.2f}{s['system_s']:>7.2f}"
            f"{_ms(s.get('loop_thread_ms')):>13}{_ms(s.get('other_threads_ms')):>8}"
            f"{_ms(s.get('lists_kb')):>10}"
        )
    if both is not None:
        lines.append(
            f"{'floor: bare relay + decode':<12} {both_mean:.2f} ms a turn "
            f"(median {statistics.median(both):.2f})"
        )
    ks = list(r["body_kb"]["by_turn"])
    lines += ["", "by turn index (mean of turns k-2..k+2): CPU ms / TTLB p50 ms"]
    lines.append(f"{'turn':<12}" + "".join(f"{k:>14}" for k in ks))
    lines.append(f"{'body KB':<12}" + "".join(f"{r['body_kb']['by_turn'][k]:>14.0f}" for k in ks))
    lines.append(f"{'floor':<12}" + "".join(f"{f['by_turn'][k]:>14.3f}" for k in ks))
    if both is not None:
        cells = "".join(f"{at(both, int(k)):>14.3f}" for k in ks)
        lines.append(f"{'relay+decode':<12}" + cells)
    for s in r["subjects"]:
        cells = "".join(
            f"{s['by_turn'][k]['cpu_ms']:>7.2f} /{s['by_turn'][k]['ttlb_ms_p50']:>5.1f}" for k in ks
        )
        lines.append(f"{s['subject']:<12}{cells}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--turns", type=int, default=64)
    ap.add_argument("--warm-turns", type=int, default=12, help="turns of the warm-up session")
    ap.add_argument(
        "--settle",
        type=float,
        default=0.7,
        help="seconds after each turn index for the work done after the answer (the "
        "writer's batches every 0.2 s, the ledger's every 0.5 s)",
    )
    ap.add_argument("--only", type=lambda s: s.split(","), help="subjects, comma-separated")
    ap.add_argument("--no-litellm", action="store_true")
    ap.add_argument("--litellm-version", default=ov.LITELLM_VERSION)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--ref", help="also each subject at this git ref (a temporary worktree)")
    ap.add_argument(
        "--reminders",
        action="store_true",
        help="Claude Code's <total_tokens> reminder after each user message, and the "
        "channel delivering later system messages in place (system_in_place: true)",
    )
    ap.add_argument(
        "--cjk",
        action="store_true",
        help="texts not all ASCII, as a team writing in Chinese sends them (in_cjk)",
    )
    ap.add_argument(
        "--codex",
        action="store_true",
        help="the turns as Codex CLI sends them, to /v1/responses (as_codex); LiteLLM is not run",
    )
    ap.add_argument(
        "--paired",
        action="store_true",
        help="run the subjects side by side, turn by turn (the order rotating), instead of "
        "one after another: their ratios then hold on a machine whose speed drifts",
    )
    ap.add_argument(
        "--count",
        action="store_true",
        help="instructions per turn under valgrind (callgrind) instead of CPU time",
    )
    ap.add_argument(
        "--keep",
        type=Path,
        help="with --count: keep callgrind's dumps here (SUBJECT.N, dump 2 the idle window, "
        "3 on turn 0, ...) for callgrind_annotate",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        help="run each gateway under benchmarks/pyprofile.py (cProfile, every thread, the "
        "warm-up forgotten) and write SUBJECT.pstats here; its times are cProfile's, not the "
        "gateway's",
    )
    ap.add_argument(
        "--opcodes",
        type=Path,
        help="run each gateway under benchmarks/pyops.py (every bytecode counted, by "
        "function, the warm-up forgotten) and write SUBJECT.json here; compare two with "
        "`pyops.py --diff A.json B.json --per TURNS`; its times are the tracer's",
    )
    args = ap.parse_args()
    result = ov._arun(run(args))
    print(json.dumps(result, indent=2) if args.json else table(result))


if __name__ == "__main__":
    main()
