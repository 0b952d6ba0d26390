"""The durability rows of the reliability benchmark (run them with ``reliability.py``).

Each case starts what it needs: `prefixgate upstream-sim` as the upstream, `prefixgate serve` as
a separate process with its own config and working folder, a throwaway Postgres database
on ``--pg``. Requests carry a session id each (``x-claude-code-session-id``,
``x-session-id``), so a record is matched to the answer it belongs to. Progress goes to
stderr; the table (or ``--json``) to stdout.

Durability rows (a record is durable once its answer is complete):

- ``sigkill_sqlite``, ``sigkill_postgres``: 2,000 Messages streams at concurrency 32, the
  gateway killed (SIGKILL) once half are answered, then started again: completed requests
  without a record, in each of 3 runs.
- ``store_lock``: another session holds the Postgres table (``LOCK TABLE requests IN
  ACCESS EXCLUSIVE MODE``) for 90 s while requests flow, then SIGTERM, and SIGKILL 25 s
  later if the process is still there; the lock released, the gateway started again.
- ``store_down``: the store's address refuses connections for 10 minutes under steady
  load, then the store is back (a proxy to Postgres starts listening there).
- ``journal_cost``: the journal on against off (``store.journal_path: null``), the same
  build: the instructions per request of each, counted by callgrind
  (``instructions.py --set``), which a busy machine does not move the way it moves times;
  the append is on the client's clock (it runs before the answer's last bytes), and its
  time is the ``journal_append`` row.
- ``journal_append``: one record's append (encode and write), a Claude Code turn's record.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as ov  # noqa: E402

from prefixgate.store import open_store  # noqa: E402

ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
PROMPT = {"role": "user", "content": "Summarise the build log in one line."}


def progress(message: str) -> None:
    print(f"[reliability] {message}", file=sys.stderr, flush=True)


# -- processes -----------------------------------------------------------------------------
class Upstream:
    """`prefixgate upstream-sim`, decoding at a finite rate so streams take a while."""

    def __init__(self, work: Path, decode_rate: float = 300.0) -> None:
        self.port = ov.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(work / "upstream.log", "ab")  # noqa: SIM115 - closed in stop()
        cmd = [sys.executable, "-m", "prefixgate.cli", "upstream-sim", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            [*cmd, "--decode-rate", str(decode_rate), "--log-level", "warning"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        ov.wait_http(self.url + "/v1/models", self.proc)

    def __enter__(self) -> Upstream:
        return self

    def __exit__(self, *exc: object) -> None:
        ov.stop(self.proc)
        self.log.close()


class Gateway:
    """`prefixgate serve` in its own folder (the journal lives there), with a store."""

    def __init__(self, work: Path, upstream: Upstream, dsn: str) -> None:
        self.work, self.upstream, self.dsn = work, upstream, dsn
        self.journal = work / "journal"
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> Gateway:
        port = ov.free_port()
        config = ov.gateway_config(port, self.upstream.url, None)
        config["store"] = {"dsn": self.dsn, "journal_path": str(self.journal)}
        path = self.work / "gateway.json"
        path.write_text(json.dumps(config))
        self.url = f"http://127.0.0.1:{port}"
        with open(self.work / "gateway.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "prefixgate.cli", "serve", "--config", str(path)],
                cwd=self.work,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        ov.wait_http(self.url + "/healthz", self.proc)
        return self

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM and wait; the exit status, or None if it had to be killed."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def journal_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.journal.glob("*/*.jsonl"))


class Database:
    """A throwaway Postgres database beside the admin DSN's, dropped on exit."""

    def __init__(self, admin_dsn: str) -> None:
        self.admin, self.name = admin_dsn, f"prefixgate_rel_{secrets.token_hex(4)}"
        with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        self.parts = urlsplit(admin_dsn)._replace(path=f"/{self.name}")
        self.dsn = urlunsplit(self.parts)
        self.address = (self.parts.hostname or "127.0.0.1", self.parts.port or 5432)

    def with_port(self, port: int) -> str:
        """This database's DSN, but at another port of the loopback."""
        user = self.parts.netloc.rpartition("@")[0]
        return urlunsplit(self.parts._replace(netloc=f"{user}@127.0.0.1:{port}".lstrip("@")))

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        with psycopg.connect(self.admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


class Relay:
    """A TCP relay on ``port`` to ``target``, started late: the store "comes back"."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.port, self.target = port, target
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _serve(self, ready: threading.Event) -> None:
        async def pipe(reader, writer) -> None:
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except OSError:
                pass
            finally:
                writer.close()

        async def client(reader, writer) -> None:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

        async def main() -> None:
            await asyncio.start_server(client, "127.0.0.1", self.port)
            ready.set()
            await asyncio.Event().wait()

        self.loop.run_until_complete(main())


# -- load ----------------------------------------------------------------------------------
async def request(client: httpx.AsyncClient, url: str, sid: str, stream: bool) -> bool:
    """One request with its own session id; True when its answer arrived complete."""
    try:
        if stream:
            body = {"model": "m", "max_tokens": 32, "stream": True, "messages": [PROMPT]}
            headers = {"x-claude-code-session-id": sid}
            r = await client.post(url + "/v1/messages", json=body, headers=headers)
            return r.status_code == 200 and "event: message_stop" in r.text
        body = {"model": "m", "max_tokens": 32, "messages": [PROMPT]}
        r = await client.post(
            url + "/v1/chat/completions", json=body, headers={"x-session-id": sid}
        )
        return r.status_code == 200 and bool(r.json().get("choices"))
    except (httpx.HTTPError, ValueError):
        return False


def burst(url: str, n: int, concurrency: int, tag: str, done: list[str]) -> threading.Thread:
    """``n`` Messages streams at ``concurrency``, in a thread; complete ones into ``done``."""

    async def main() -> None:
        gate = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(timeout=120) as client:

            async def one(i: int) -> None:
                async with gate:
                    if await request(client, url, f"{tag}-{i:06d}", True):
                        done.append(f"{tag}-{i:06d}")

            await asyncio.gather(*(one(i) for i in range(n)))

    t = threading.Thread(target=asyncio.run, args=(main(),))
    t.start()
    return t


def steady(url: str, rps: float, tag: str, done: list[str], stop: threading.Event):
    """Requests at ``rps`` (streams and chat answers alternating) until ``stop``."""

    async def main() -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            tasks, i, t0 = set(), 0, time.monotonic()

            async def one(i: int) -> None:
                if await request(client, url, f"{tag}-{i:06d}", i % 2 == 0):
                    done.append(f"{tag}-{i:06d}")

            while not stop.is_set():
                task = asyncio.create_task(one(i))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
                await asyncio.sleep(max(0.0, t0 + i / rps - time.monotonic()))
            await asyncio.gather(*tasks)

    t = threading.Thread(target=asyncio.run, args=(main(),))
    t.start()
    return t


def sessions(dsn: str) -> collections.Counter[str]:
    with open_store(dsn) as store:
        return collections.Counter(r.session_id for r in store.iter_records())


def until_stored(dsn: str, done: list[str], limit: float) -> float:
    """Poll the store until it holds every session in ``done``; the seconds it took."""
    t0 = time.monotonic()
    want = set(done)
    while time.monotonic() - t0 < limit:
        try:
            if want <= set(sessions(dsn)):
                break
        except Exception:  # the schema may not be there yet
            pass
        time.sleep(0.5)
    return time.monotonic() - t0


def unrecorded(dsn: str, done: list[str]) -> tuple[int, int]:
    """Completed requests without a record, and with more than one."""
    stored = sessions(dsn)
    return sum(1 for s in done if not stored[s]), sum(1 for s in done if stored[s] > 1)


def restart_and_count(gw: Gateway, done: list[str], limit: float = 300) -> tuple[int, int]:
    """Start the gateway again (it stores what its journal holds), stop it, count."""
    gw.start()
    until_stored(gw.dsn, done, limit)
    gw.stop()
    return unrecorded(gw.dsn, done)


def row(case: str, result: str, goal: str, met: bool) -> dict:
    return {"case": case, "result": result, "goal": goal, "met": met}


# -- durability ----------------------------------------------------------------------------
def sigkill_under_load(args, backend: str) -> dict:
    name = f"sigkill_{backend}"
    lost, twice, completed, recovered = [], 0, [], []
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="prefixgate-rel-")))
        upstream = stack.enter_context(Upstream(work))
        db = stack.enter_context(Database(args.pg)) if backend == "postgres" else None
        for run in range(args.runs):
            run_dir = work / f"run{run}"
            run_dir.mkdir()
            dsn = db.dsn if db else f"sqlite:///{run_dir / 'records.db'}"
            gw = Gateway(run_dir, upstream, dsn).start()
            done: list[str] = []
            t = burst(gw.url, args.streams, args.concurrency, f"kill{run}", done)
            while len(done) < args.streams // 2 and t.is_alive():
                time.sleep(0.01)
            gw.proc.send_signal(signal.SIGKILL)
            gw.proc.wait()
            t.join()
            journaled = unrecorded(dsn, done)[0]  # complete, not in the store yet
            progress(f"{name} run {run + 1}: killed; {len(done)} complete, {journaled} unstored")
            missing, more = restart_and_count(gw, done)
            lost.append(missing)
            twice += more
            completed.append(len(done))
            recovered.append(journaled)
            progress(f"{name} run {run + 1}: {missing} without a record, {more} twice")
    result = (
        " / ".join(map(str, lost))
        + f" completed requests without a record (of {' / '.join(map(str, completed))});"
        + f" {' / '.join(map(str, recovered))} of them were stored from the journal after"
        " the restart" + (f"; {twice} recorded twice" if twice else "")
    )
    return row(name, result, f"0 in each of {args.runs} runs", not any(lost) and not twice)


def store_lock(args) -> dict:
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="prefixgate-rel-")))
        upstream = stack.enter_context(Upstream(work))
        db = stack.enter_context(Database(args.pg))
        gw = Gateway(work, upstream, db.dsn).start()
        done: list[str] = []
        stop = threading.Event()
        load = steady(gw.url, args.rps, "lock", done, stop)
        while not done:
            time.sleep(0.1)
        until_stored(db.dsn, done[:1], 60)  # the table exists
        holder = stack.enter_context(psycopg.connect(db.dsn))
        holder.execute("LOCK TABLE requests IN ACCESS EXCLUSIVE MODE")
        progress(f"store_lock: table locked for {args.lock_seconds:g} s under load")
        time.sleep(args.lock_seconds)
        gw.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        try:
            rc, killed = gw.proc.wait(args.kill_after), False
        except subprocess.TimeoutExpired:
            gw.proc.kill()
            rc, killed = gw.proc.wait(), True
        exited = time.monotonic() - t0
        stop.set()
        load.join()
        progress(f"store_lock: exited {exited:.1f} s after SIGTERM (SIGKILL: {killed})")
        holder.rollback()
        missing, twice = restart_and_count(gw, done)
    result = (
        f"{missing} of {len(done)} completed requests without a record"
        + (f", {twice} twice" if twice else "")
        + f"; exited {exited:.1f} s after SIGTERM"
        + (" (SIGKILL needed)" if killed else f" with status {rc}, before the SIGKILL")
    )
    goal = f"0 without a record; exits before the SIGKILL {args.kill_after:g} s later"
    return row("store_lock", result, goal, missing == 0 and not twice and rc == 0)


def store_down(args) -> dict:
    seconds = args.store_down_minutes * 60
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="prefixgate-rel-")))
        upstream = stack.enter_context(Upstream(work))
        db = stack.enter_context(Database(args.pg))
        port = ov.free_port()  # nothing listens here until the store "comes back"
        gw = Gateway(work, upstream, db.with_port(port)).start()
        done: list[str] = []
        stop = threading.Event()
        load = steady(gw.url, args.rps, "down", done, stop)
        peak, t0, said = 0, time.monotonic(), 0.0
        while time.monotonic() - t0 < seconds:
            time.sleep(1)
            peak = max(peak, gw.journal_bytes())
            if time.monotonic() - said >= 60:
                said = time.monotonic()
                progress(f"store_down: {len(done)} answers, journal {peak >> 10} KiB")
        Relay(port, db.address)
        progress("store_down: the store is back")
        catch_up = until_stored(db.dsn, list(done), 600)
        stop.set()
        load.join()
        rc = gw.stop()
        missing, twice = unrecorded(db.dsn, done)
    result = (
        f"{missing} of {len(done)} completed requests without a record"
        + (f", {twice} twice" if twice else "")
        + f"; journal peak {peak / (1 << 20):.1f} MiB; all stored {catch_up:.0f} s after"
        f" the store came back, without a restart; exit status {rc}"
    )
    goal = f"0 without a record after {args.store_down_minutes:g} minutes down"
    return row("store_down", result, goal, missing == 0 and not twice and rc == 0)


def journal_cost(args) -> dict:
    counts = {}
    for side, sets in (("on", []), ("off", ["--set", "store.journal_path=null"])):
        cmd = [sys.executable, str(ov.HERE / "instructions.py"), "--only", "/store", "--json"]
        cmd += ["-n", str(args.instructions_n), *sets]
        progress(f"journal_cost, journal {side}: " + " ".join(cmd[1:]))
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
        counts[side] = {c["case"]: c["instructions"] for c in json.loads(out)["cases"]}
    parts = []
    for case, on in counts["on"].items():
        off = counts["off"][case]
        parts.append(f"{case} {on / 1e6:.2f}M on, {off / 1e6:.2f}M off ({on / off - 1:+.1%})")
    # What the journal adds before the answer's last bytes is the append: its time is the
    # client's added latency; the instructions are its CPU, beside the count's own noise
    # with a store (the writer thread's batches differ from run to run: about ±5 %).
    us, _ = append_us(2000)
    result = f"the append on the client's clock, {us:.1f} µs; instructions per request: "
    result += "; ".join(parts)
    return row("journal_cost", result, "≤ 0.05 ms p50 per request", us <= 50)


def append_us(n: int) -> tuple[float, float]:
    """The median µs of one append of a Claude Code turn's record (5 passes of ``n``) and
    the bytes a record takes in the journal."""
    from record_writer import make_records

    from prefixgate.record.journal import Journal

    records = make_records(n)
    with tempfile.TemporaryDirectory(prefix="prefixgate-rel-") as tmp:
        journal = Journal(Path(tmp) / "journal")
        journal.open()
        per = []
        for _ in range(5):
            t0 = time.perf_counter()
            for record in records:
                journal.append(record)
            per.append((time.perf_counter() - t0) / len(records) * 1e6)
        size = journal.bytes / (5 * len(records))
        journal.close(everything_stored=True)
    return statistics.median(per), size


def journal_append(args) -> dict:
    us, size = append_us(2000)
    result = f"{us:.1f} µs per record ({size / 1024:.1f} KiB, 40 segments: encode and write)"
    return row("journal_append", result, "≤ 50 µs", us <= 50)


CASES: dict[str, Callable[[argparse.Namespace], dict]] = {
    "sigkill_sqlite": lambda a: sigkill_under_load(a, "sqlite"),
    "sigkill_postgres": lambda a: sigkill_under_load(a, "postgres"),
    "store_lock": store_lock,
    "store_down": store_down,
    "journal_cost": journal_cost,
    "journal_append": journal_append,
}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--pg", default=ADMIN_DSN, help="a Postgres DSN that may create databases")
    ap.add_argument("--runs", type=int, default=3, help="SIGKILL runs per store")
    ap.add_argument("--streams", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rps", type=float, default=12.0, help="steady load of the store cases")
    ap.add_argument("--lock-seconds", type=float, default=90.0)
    ap.add_argument("--kill-after", type=float, default=25.0, help="SIGKILL after SIGTERM")
    ap.add_argument("--store-down-minutes", type=float, default=10.0)
    ap.add_argument(
        "--instructions-n", type=int, default=100, help="requests counted per case by journal_cost"
    )
