"""Instructions a relay spends per stream chunk, counted by callgrind: the gateway's chat
passthrough (splice), its Messages conversion, and the bare relay (the floor); and, with
many streams interleaved, the cache misses per chunk (a simulated cache).

    python benchmarks/relay_chunks.py [--paths floor,chat,messages] [--chunks 8,200]
                                      [--streams N] [--interleave M] [--misses]
                                      [--ll-size BYTES] [--ref GIT_REF] [--keep DIR] [--json]

Each path's relay (``prefixgate serve``, one worker, no store; or ``overhead_floor.py``,
the bare uvloop relay of ``streams.py --floor``) runs under ``valgrind --tool=callgrind``
with counting off. This process is its upstream and its client, in lock step: the
upstream writes a stream's next chunk (a compact-JSON chat chunk, as vLLM writes it) only
once the client has received the one before, so each chunk is one read and one write of
the relay, as in ``streams.py``'s paced streams (and none are coalesced). After a warm-up,
``--streams`` rounds of the short length and then as many of the long one are counted
(user-space instructions, between ``callgrind_control`` zero and dump); per chunk =
(long − short) / (the chunks between them), so what a request costs once cancels out.
What the gateway *adds* per chunk is its figure minus the floor's. ``--ref`` also counts
the gateway as it was at a git ref (checked out into a temporary worktree).

Interleaved streams (``--interleave M``, default 1: one stream at a time). At high
concurrency the time a chunk costs does not follow its instructions: with a thousand
streams taking turns, each chunk finds its own stream's objects (its connections,
buffers, parser and converter state) gone from the CPU caches since its previous chunk,
and the misses fetching them back cost more than the instructions. One stream at a time
keeps everything cached, so it cannot show this. With ``--interleave M`` a round opens M
streams at once, each on its own client connection (and so its own upstream connection:
the gateway pools them, the floor opens one per client), all M requests sent together;
then the lock step goes round robin: stream 0's upstream writes its next chunk, once
stream 0's client has it stream 1's upstream writes its next, …, after stream M−1 back to
stream 0 (the upstream tells the streams apart by their model, ``lock-<chunks>-<i>``). So
M−1 other streams' chunks pass through the relay between two chunks of one stream, as at
high concurrency, yet each chunk is still one read and one write. ``--streams`` is the
number of such rounds counted of each length (default 5 with M = 1, else 1); per chunk =
(M streams of the long length − M of the short) / (rounds × M × (long − short)). The
warm-up then has a round of the long length too (what a connection does once, the first
time it carries a stream that long, would otherwise be counted per chunk: at M = 10 and
``--chunks 4,14``, three times the figure). What a request costs varies a little from one
request to the next and does not cancel: the figures move by a few percent between runs,
less with more chunks between the lengths.

Cache misses (``--misses``): callgrind also simulates the caches (``--cache-sim=yes``),
pinned so the figures depend neither on the machine nor on its load: I1 and D1 of
32 KiB, 8-way, 64-byte lines (``--I1=32768,8,64 --D1=32768,8,64``, not valgrind's
guess of the host's), and a last level (LL) of ``--ll-size`` bytes (default 2 MiB, about
one core's share of a server's L3), 16-way, 64-byte lines. Per chunk, besides the
instructions (Ir): the D1 misses (D1mr + D1mw, data fetched from the next level) and the
LL data misses (DLmr + DLmw, data fetched from memory), the figure that time at high
concurrency follows: memory touched per chunk that does not stay cached, not
instructions. LL misses appear only once the M streams' state outgrows the LL: at 100
streams the gateway's fits in 2 MiB (its LL figure is noise around 0; ``--ll-size 512K``
shows it), at 1,000 it does not. For example:

    python benchmarks/relay_chunks.py --chunks 4,44 --streams 1 --interleave 100 --misses
    python benchmarks/relay_chunks.py --chunks 4,24 --streams 1 --interleave 1000 --misses

Limits: the caches are simulated (one level of data cache and one last level, LRU, no
prefetcher, no other process or core sharing them, the relay's threads sharing one), so
the misses are an index of the memory a chunk touches that the machine's load does not
disturb, to compare paths and versions, not a prediction of a CPU's counters. Valgrind runs the relay's threads one at
a time. The kernel is not counted, neither its instructions nor its misses (the two system
calls a chunk and the socket buffers they copy, the same for every path):
``streams.py --floor`` measures that in time.

The figures count everything the relay process does in user space while the chunks pass
(the event loop, the HTTP parsing, the relay, the timers). Needs ``valgrind`` (Debian:
``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as ov  # noqa: E402
from instructions import checked_out  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROMPT = "Find which change broke the failing test and answer with the file and line. " * 20
_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
MARK = b'" w'  # each content piece is " w<i>": the client counts them in what it receives
# The figures per chunk: their key, and the callgrind events summed into each.
FIGURES = {
    "per_chunk": ("Ir",),
    "d1_misses_per_chunk": ("D1mr", "D1mw"),
    "ll_misses_per_chunk": ("DLmr", "DLmw"),
}
LL_SIZE = 2 * 1024 * 1024
CACHE_L1 = "32768,8,64"  # I1 and D1: size, ways, line bytes


def _chunk(
    model: str, delta: dict | None, finish: str | None = None, usage: dict | None = None
) -> bytes:
    """One SSE event of a chat stream as vLLM writes it (compact JSON, the model named as
    asked), HTTP-chunked."""
    obj: dict = {
        "id": "chatcmpl-lockstep",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": model,
        "choices": (
            []
            if usage
            else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        ),
    }
    if usage:
        obj["usage"] = usage
    data = b"data: " + msgspec.json.encode(obj) + b"\n\n"
    return b"%x\r\n%b\r\n" % (len(data), data)


def model_name(chunks: int, stream: int | None = None) -> str:
    """The model a lock-step stream asks for: its chunks, and its index in the round when
    streams are interleaved (``lock-200``, ``lock-44-3``)."""
    return f"lock-{chunks}" if stream is None else f"lock-{chunks}-{stream}"


def parse_model(model: str) -> tuple[int, int]:
    """(chunks, stream index) of :func:`model_name`'s name (index 0 when it has none)."""
    parts = model.split("-")
    return int(parts[1]), int(parts[2]) if len(parts) > 2 else 0


class Lockstep:
    """The lock step of one round of M streams: which upstream connection answers each
    stream, and whose chunk is in flight. Once every client has its stream's first chunk,
    the streams take turns in round robin: when the client of the stream whose turn it is
    has its chunk, the next live stream's upstream writes its next chunk (with M = 1, the
    one stream's upstream writes its next). A stream that ends leaves the round."""

    def __init__(self) -> None:
        self.begin(1)

    def begin(self, m: int) -> None:
        self.ups: list[Upstream | None] = [None] * m
        self.live = [True] * m
        self.started = 0  # streams whose client has the first chunk
        self.turn = -1  # the stream whose chunk is in flight; -1 until all have started
        self.order: list[tuple[int, int]] = []  # (stream, chunk) as the clients got them
        self.ended: list[int] = []  # the streams, in the order their clients saw the end

    def answering(self, stream: int, up: Upstream) -> None:
        self.ups[stream] = up

    def received(self, stream: int, seen: int) -> None:
        """The client of ``stream`` has ``seen`` of its chunks."""
        up = self.ups[stream]
        if up is None or seen != up.sent:
            return
        self.order.append((stream, seen - 1))
        if self.turn < 0:
            self.started += seen == 1
            if self.started == len(self.ups):
                self._next()
        elif stream == self.turn:
            self._next()

    def finished(self, stream: int) -> None:
        """The client of ``stream`` has its end."""
        self.live[stream] = False
        self.ended.append(stream)
        if stream == self.turn:
            self._next()

    def _next(self) -> None:
        m = len(self.ups)
        for step in range(1, m + 1):
            j = (self.turn + step) % m
            if self.live[j]:
                self.turn = j
                up = self.ups[j]
                assert up is not None
                up.next()
                return


class Upstream(asyncio.Protocol):
    """The lock-step upstream: answers a streaming chat request with its head and first
    content chunk, then one chunk each time :meth:`next` is called (by its
    :class:`Lockstep`), then the finish, the usage and ``[DONE]``. The number of chunks
    and the stream's index are in the model (``lock-200``, ``lock-44-3``); a pooled
    connection answers whichever stream asks on it."""

    def __init__(self, lock: Lockstep) -> None:
        self.lock = lock
        self.buf = b""
        self.sent = self.total = 0
        self.model = ""

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        m = re.search(rb"content-length: *(\d+)", self.buf[:end].lower())
        need = end + 4 + (int(m.group(1)) if m else 0)
        if len(self.buf) < need:
            return
        body, self.buf = self.buf[end + 4 : need], self.buf[need:]
        model = json.loads(body).get("model", "") if body else ""
        if not model.startswith("lock-"):
            self.transport.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            return
        self.total, stream = parse_model(model)
        self.model, self.sent = model, 1
        self.lock.answering(stream, self)
        role = _chunk(model, {"role": "assistant", "content": ""})
        self.transport.write(_SSE_HEAD + role + _chunk(model, {"content": " w0"}))

    def next(self) -> None:
        if self.sent < self.total:
            self.transport.write(_chunk(self.model, {"content": f" w{self.sent}"}))
            self.sent += 1
            return
        usage = {"prompt_tokens": 600, "completion_tokens": self.total, "total_tokens": 900}
        done = b"data: [DONE]\n\n"
        self.transport.write(
            _chunk(self.model, {}, "stop")
            + _chunk(self.model, None, usage=usage)
            + b"%x\r\n%b\r\n0\r\n\r\n" % (len(done), done)
        )
        self.sent += 1


class Client(asyncio.Protocol):
    """One kept-alive client connection, stream ``index`` of each round; one stream at a
    time. Each read that brings a chunk more tells the :class:`Lockstep`."""

    def __init__(self, lock: Lockstep, index: int = 0) -> None:
        self.lock, self.index = lock, index
        self.buf = b""
        self.seen = self.chunks = 0
        self.done: asyncio.Future | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError(f"the relay closed the connection: {exc}"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.buf.endswith(b"0\r\n\r\n"):
            if not self.buf.startswith(b"HTTP/1.1 200"):
                self.done.set_exception(RuntimeError(self.buf[:300].decode("latin-1")))
            elif self.buf.count(MARK) != self.chunks:
                got = self.buf.count(MARK)
                self.done.set_exception(
                    RuntimeError(f"stream {self.index}: {got} chunks of {self.chunks}")
                )
            else:
                self.done.set_result(self.buf)
            self.lock.finished(self.index)
            return
        seen = self.buf.count(MARK)
        if seen > self.seen:
            self.seen = seen
            self.lock.received(self.index, seen)

    async def stream(self, request: bytes, chunks: int) -> bytes:
        if self.transport.is_closing():
            raise ConnectionError(f"the relay closed client connection {self.index} while idle")
        self.buf, self.seen, self.chunks = b"", 0, chunks
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self.done


def request(path: str, chunks: int, stream: int | None = None) -> bytes:
    model = model_name(chunks, stream)
    if path == "messages":
        body = {
            "model": model,
            "max_tokens": 1024,
            "stream": True,
            "system": "You are a coding agent.",
            "messages": [{"role": "user", "content": PROMPT}],
        }
        url, extra = "/v1/messages", b"anthropic-version: 2023-06-01\r\n"
    else:
        body = {
            "model": model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": PROMPT},
            ],
        }
        url, extra = "/v1/chat/completions", b""
    data = json.dumps(body).encode()
    head = (
        b"POST %b HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"%bcontent-length: %d\r\n\r\n" % (url.encode(), extra, len(data))
    )
    return head + data


async def rounds(clients: list[Client], lock: Lockstep, path: str, chunks: int, n: int) -> None:
    """``n`` rounds of one stream of ``chunks`` chunks on each client, all of a round's
    requests sent together, then the lock step in round robin until all have ended (with
    one client, the streams one after the other, the model without an index)."""
    named = len(clients) > 1
    for _ in range(n):
        lock.begin(len(clients))
        await asyncio.gather(
            *(c.stream(request(path, chunks, c.index if named else None), chunks) for c in clients)
        )


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, check=True)


def parse_dump(text: str) -> dict[str, int]:
    """The costs of a callgrind dump by event name: its ``events:`` line names them, its
    ``summary:`` line (else its ``totals:`` line) has one number each, in that order (those
    left off at the end are 0). The summary, not the totals: the first dump after a
    ``callgrind_control -z`` can have totals (the sum of its cost lines) well above what
    ran since the zero, its summary not."""
    events = re.search(r"^events: *(.+)$", text, re.M)
    total = re.search(r"^summary: *(.+)$", text, re.M) or re.search(r"^totals: *(.+)$", text, re.M)
    if events is None or total is None:
        raise ValueError("no events: or no summary:/totals: line in the dump")
    names, numbers = events.group(1).split(), [int(x) for x in total.group(1).split()]
    if len(numbers) > len(names):
        raise ValueError(f"{len(numbers)} totals for {len(names)} events")
    return dict(zip(names, numbers + [0] * (len(names) - len(numbers)), strict=True))


def per_chunk(
    short: dict[str, int], long_: dict[str, int], chunks: tuple[int, int], rounds: int, m: int
) -> dict[str, float]:
    """The :data:`FIGURES` per chunk from the costs of ``rounds`` rounds of ``m`` streams
    of the short and of the long length (those whose events both dumps have)."""
    n = rounds * m * (chunks[1] - chunks[0])
    return {
        key: sum(long_[e] - short[e] for e in events) / n
        for key, events in FIGURES.items()
        if all(e in short and e in long_ for e in events)
    }


def added_key(key: str) -> str:
    """The key of what the gateway adds to the floor's figure ``key``."""
    return key.replace("per_chunk", "added")


def _dump(out: Path, before: set[Path]) -> Path:
    """The dump written since ``before`` was listed."""
    new = sorted(set(out.parent.glob(out.name + "*")) - before, key=lambda p: p.stat().st_mtime)
    if not new:
        raise SystemExit("callgrind wrote no dump")
    return new[-1]


def valgrind(out: Path, ll_size: int | None) -> list[str]:
    """Callgrind, counting off at the start; with ``ll_size``, simulating the caches."""
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    if ll_size is not None:
        cmd += ["--cache-sim=yes", f"--I1={CACHE_L1}", f"--D1={CACHE_L1}"]
        cmd += [f"--LL={ll_size},16,64"]
    return cmd


async def count(
    path: str,
    chunks: tuple[int, int],
    streams: int,
    src: Path | None,
    keep: Path | None = None,
    *,
    interleave: int = 1,
    ll_size: int | None = None,
) -> dict[str, float]:
    """The figures per chunk of one path (``src``: the package sources to run): rounds of
    ``interleave`` streams; with ``ll_size``, the cache misses too."""
    loop = asyncio.get_running_loop()
    work = Path(tempfile.mkdtemp(prefix="prefixgate-relay-chunks-"))
    lock = Lockstep()
    server = await loop.create_server(lambda: Upstream(lock), "127.0.0.1", 0)
    up_port = server.sockets[0].getsockname()[1]
    port = ov.free_port()
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    if path == "floor":
        cmd = [sys.executable, str(HERE / "overhead_floor.py"), "--port", str(port)]
        cmd += ["--upstream-port", str(up_port)]
    else:
        config = ov.gateway_config(port, f"http://127.0.0.1:{up_port}", None)
        config["server"]["busy_poll_us"] = 0  # its idle turns would count as the relay's
        config["server"]["shed_loop_lag"] = None  # under valgrind the loop always runs late
        config["channels"][0]["render_order"] = "tools_first"  # no probes of the upstream
        if interleave > 1:
            # M connections under valgrind take longer to open (and dumps between rounds
            # to write) than the idle timeouts of the client connections (5 s) and of the
            # pooled upstream ones (4 s): none closed, none reopened in a counted round
            config["server"]["keepalive"] = 3600.0
            config["channels"][0]["keepalive"] = 3600.0
        (work / "config.json").write_text(json.dumps(config))
        cmd = [sys.executable, "-m", "prefixgate.cli", "serve", "--config"]
        cmd += [str(work / "config.json"), "--log-level", "warning"]
    out = work / "callgrind.out"
    log = open(work / "valgrind.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(valgrind(out, ll_size) + cmd, stdout=log, stderr=log, env=env)
    clients: list[Client] = []
    try:
        for _ in range(1200):  # valgrind starts slowly
            if proc.poll() is not None:
                raise SystemExit(
                    f"{path}: the relay exited:\n{(work / 'valgrind.log').read_text()}"
                )
            try:
                _, client = await loop.create_connection(lambda: Client(lock), "127.0.0.1", port)
                clients.append(client)
                break
            except OSError:
                await asyncio.sleep(0.5)
        if not clients:
            raise SystemExit(f"{path}: the relay did not come up")
        for i in range(1, interleave):
            _, client = await loop.create_connection(lambda i=i: Client(lock, i), "127.0.0.1", port)
            clients.append(client)
        short, long_ = chunks
        # the warm-up counted (then zeroed), so that the simulated caches are warm too;
        # interleaved, a round of the long length first: what each connection does once,
        # the first time it carries a stream that long, is not counted as per chunk
        _control(proc.pid, "-i", "on")
        if interleave > 1:
            await rounds(clients, lock, path, long_, 1)
        await rounds(clients, lock, path, short, 3 if interleave == 1 else 2)
        figures = []
        for n in (short, long_):
            _control(proc.pid, "-z")
            await rounds(clients, lock, path, n, streams)
            before = set(work.glob(out.name + "*"))
            _control(proc.pid, "-d")
            dump = _dump(out, before)
            figures.append(parse_dump(dump.read_text()))
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                tag = f"{path}-{n}" + (f"-m{interleave}" if interleave > 1 else "")
                shutil.copy(dump, keep / f"callgrind.{tag}{'' if src is None else '-ref'}")
        _control(proc.pid, "-i", "off")
    finally:
        for client in clients:
            client.transport.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        log.close()
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    return per_chunk(figures[0], figures[1], chunks, streams, interleave)


async def run(args) -> list[dict]:
    counted = (args.chunks, args.streams)
    opts = {"interleave": args.interleave, "ll_size": args.ll_size if args.misses else None}
    rows = []
    with checked_out(args.ref) as ref_tree:
        for path in args.paths:
            print(f"counting {path} …", file=sys.stderr, flush=True)
            row: dict = {"path": path, **await count(path, *counted, None, args.keep, **opts)}
            if ref_tree is not None and path != "floor":
                ref = await count(path, *counted, ref_tree / "src", args.keep, **opts)
                row.update({f"ref_{k}": v for k, v in ref.items()})
            rows.append(row)
    floor = next((r for r in rows if r["path"] == "floor"), None)
    for r in rows:
        if floor is None or r["path"] == "floor":
            continue
        for key in FIGURES:
            if key in floor and key in r:
                r[added_key(key)] = r[key] - floor[key]
            if key in floor and f"ref_{key}" in r:
                r[f"ref_{added_key(key)}"] = r[f"ref_{key}"] - floor[key]
    return rows


def table(rows: list[dict], ref: str | None, misses: bool) -> list[str]:
    """The figures as a table: thousands of instructions, misses as they are."""

    def cell(r: dict, key: str, width: int, scale: float = 1.0) -> str:
        return f"{r[key] / scale:>{width}.2f}" if key in r else f"{'':>{width}}"

    head = f"{'path':<10}{'k instr/chunk':>15}{'added':>10}"
    if misses:
        head += f"{'D1 miss/chunk':>15}{'added':>10}{'LL miss/chunk':>15}{'added':>10}"
    if ref:
        head += f"{'at ' + ref[:10]:>16}{'added':>10}{'ratio':>8}"
        if misses:
            head += f"{'D1 miss':>10}{'added':>10}{'LL miss':>10}{'added':>10}"
    lines = [head]
    for r in rows:
        line = f"{r['path']:<10}{cell(r, 'per_chunk', 15, 1e3)}{cell(r, 'added', 10, 1e3)}"
        if misses:
            line += cell(r, "d1_misses_per_chunk", 15) + cell(r, "d1_misses_added", 10)
            line += cell(r, "ll_misses_per_chunk", 15) + cell(r, "ll_misses_added", 10)
        if "ref_per_chunk" in r:
            line += cell(r, "ref_per_chunk", 16, 1e3) + cell(r, "ref_added", 10, 1e3)
            line += f"{r['per_chunk'] / r['ref_per_chunk']:>8.2f}"
            if misses:
                line += cell(r, "ref_d1_misses_per_chunk", 10)
                line += cell(r, "ref_d1_misses_added", 10)
                line += cell(r, "ref_ll_misses_per_chunk", 10)
                line += cell(r, "ref_ll_misses_added", 10)
        lines.append(line)
    return lines


def _size(text: str) -> int:
    """Bytes, from ``2097152``, ``2048K`` or ``2M``; a size valgrind takes for a 16-way
    cache of 64-byte lines (its number of sets a power of two)."""
    scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:].upper(), 1)
    size = int(text[:-1] if scale > 1 else text) * scale
    sets = size // (16 * 64)
    if size % (16 * 64) or sets < 1 or sets & (sets - 1):
        raise argparse.ArgumentTypeError(f"{text}: not 16 × 64 bytes × a power of two")
    return size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", default="floor,chat,messages")
    ap.add_argument("--chunks", default="8,200", help="the short and the long stream's chunks")
    ap.add_argument(
        "--streams",
        type=int,
        help="rounds counted of each length (default 5 with --interleave 1, else 1)",
    )
    ap.add_argument(
        "--interleave",
        type=int,
        default=1,
        metavar="M",
        help="streams open at once, their chunks in round robin (default 1)",
    )
    ap.add_argument(
        "--misses", action="store_true", help="also count cache misses (simulated caches)"
    )
    ap.add_argument(
        "--ll-size",
        type=_size,
        default=LL_SIZE,
        metavar="BYTES",
        help="the simulated last-level cache with --misses (default 2M; 16-way, 64-byte lines)",
    )
    ap.add_argument("--ref", help="also count the gateway at this git ref")
    ap.add_argument(
        "--keep", type=Path, help="keep each count's callgrind dump here (callgrind_annotate)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    if args.interleave < 1:
        ap.error("--interleave must be at least 1")
    if args.streams is None:
        args.streams = 5 if args.interleave == 1 else 1
    args.paths = args.paths.split(",")
    short, long_ = (int(x) for x in args.chunks.split(","))
    args.chunks = (short, long_)
    rows = ov._arun(run(args))
    if args.json:
        result = {"chunks": args.chunks, "streams": args.streams, "interleave": args.interleave}
        if args.misses:
            result.update(ll_size=args.ll_size, l1=CACHE_L1)
        print(json.dumps({**result, "rows": rows}, indent=2))
        return
    print("\n".join(table(rows, args.ref, args.misses)))


if __name__ == "__main__":
    main()
