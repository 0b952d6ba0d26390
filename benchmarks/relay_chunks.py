"""Instructions a relay spends per stream chunk, counted by callgrind: the gateway's chat
passthrough (splice), its Messages conversion, and the bare relay (the floor).

    python benchmarks/relay_chunks.py [--paths floor,chat,messages] [--chunks 8,200]
                                      [--streams 5] [--ref GIT_REF] [--json]

Each path's relay (``prefixgate serve``, one worker, no store; or ``overhead_floor.py``,
the bare uvloop relay of ``streams.py --floor``) runs under ``valgrind --tool=callgrind``
with counting off. This process is its upstream and its client, in lock step: the
upstream writes a stream's next chunk (a compact-JSON chat chunk, as vLLM writes it) only
once the client has received the one before, so each chunk is one read and one write of
the relay, as in ``streams.py``'s paced streams (and none are coalesced). After a warm-up,
``--streams`` streams of the short length and then as many of the long one are counted
(user-space instructions, between ``callgrind_control`` zero and dump); per chunk =
(long − short) / (the chunks between them), so what a request costs once cancels out.
What the gateway *adds* per chunk is its figure minus the floor's. ``--ref`` also counts
the gateway as it was at a git ref (checked out into a temporary worktree).

The figures count everything the relay process does in user space while the chunks pass
(the event loop, the HTTP parsing, the relay, the timers), not the kernel's share (the two
system calls a chunk, the same for every path): ``streams.py --floor`` measures that in time.
Needs ``valgrind`` (Debian: ``apt-get install valgrind``).
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


class Upstream(asyncio.Protocol):
    """The lock-step upstream: answers a streaming chat request with its head and first
    content chunk, then one chunk each time :meth:`next` is called, then the finish, the
    usage and ``[DONE]``. The number of chunks is the model's suffix (``lock-200``)."""

    current: Upstream | None = None  # the connection answering the stream in flight

    def __init__(self) -> None:
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
        self.total = int(model.rsplit("-", 1)[1])
        self.model, self.sent = model, 1
        Upstream.current = self
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
    """One kept-alive client connection; one stream at a time. Each read that brings the
    last chunk sent lets the upstream send the next."""

    def __init__(self) -> None:
        self.buf = b""
        self.seen = 0
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
            else:
                self.done.set_result(self.buf)
            return
        seen = self.buf.count(MARK)
        up = Upstream.current
        if seen > self.seen and up is not None and seen == up.sent:
            self.seen = seen
            up.next()

    async def stream(self, request: bytes) -> bytes:
        self.buf, self.seen = b"", 0
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self.done


def request(path: str, chunks: int) -> bytes:
    model = f"lock-{chunks}"
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


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, check=True)


def _totals(out: Path, before: set[Path]) -> int:
    """The instructions of the dump written since ``before`` was listed."""
    new = sorted(set(out.parent.glob(out.name + "*")) - before, key=lambda p: p.stat().st_mtime)
    if not new:
        raise SystemExit("callgrind wrote no dump")
    m = re.search(r"^(?:totals|summary): *(\d+)", new[-1].read_text(), re.M)
    if m is None:
        raise SystemExit(f"no totals in {new[-1]}")
    return int(m.group(1))


async def count(
    path: str, chunks: tuple[int, int], streams: int, src: Path | None, keep: Path | None = None
) -> float:
    """Instructions per chunk of one path (``src``: the package sources to run)."""
    loop = asyncio.get_running_loop()
    work = Path(tempfile.mkdtemp(prefix="prefixgate-relay-chunks-"))
    server = await loop.create_server(Upstream, "127.0.0.1", 0)
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
        (work / "config.json").write_text(json.dumps(config))
        cmd = [sys.executable, "-m", "prefixgate.cli", "serve", "--config"]
        cmd += [str(work / "config.json"), "--log-level", "warning"]
    out = work / "callgrind.out"
    log = open(work / "valgrind.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"] + cmd,
        stdout=log,
        stderr=log,
        env=env,
    )
    try:
        client = None
        for _ in range(1200):  # valgrind starts slowly
            if proc.poll() is not None:
                raise SystemExit(
                    f"{path}: the relay exited:\n{(work / 'valgrind.log').read_text()}"
                )
            try:
                _, client = await loop.create_connection(Client, "127.0.0.1", port)
                break
            except OSError:
                await asyncio.sleep(0.5)
        if client is None:
            raise SystemExit(f"{path}: the relay did not come up")
        short, long_ = chunks
        for _ in range(3):  # warm-up
            await client.stream(request(path, short))
        _control(proc.pid, "-i", "on")
        figures = []
        for n in (short, long_):
            _control(proc.pid, "-z")
            for _ in range(streams):
                await client.stream(request(path, n))
            before = set(work.glob(out.name + "*"))
            _control(proc.pid, "-d")
            figures.append(_totals(out, before))
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                tag = f"{path}-{n}{'' if src is None else '-ref'}"
                last = max(set(work.glob(out.name + "*")) - before, key=lambda p: p.stat().st_mtime)
                shutil.copy(last, keep / f"callgrind.{tag}")
        _control(proc.pid, "-i", "off")
        client.transport.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        log.close()
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    return (figures[1] - figures[0]) / (streams * (long_ - short))


async def run(args) -> list[dict]:
    counted = (args.chunks, args.streams)
    rows = []
    with checked_out(args.ref) as ref_tree:
        for path in args.paths:
            print(f"counting {path} …", file=sys.stderr, flush=True)
            row = {"path": path, "per_chunk": await count(path, *counted, None, args.keep)}
            if ref_tree is not None and path != "floor":
                row["ref_per_chunk"] = await count(path, *counted, ref_tree / "src", args.keep)
            rows.append(row)
    floor = next((r["per_chunk"] for r in rows if r["path"] == "floor"), None)
    for r in rows:
        if floor is not None and r["path"] != "floor":
            r["added"] = r["per_chunk"] - floor
            if "ref_per_chunk" in r:
                r["ref_added"] = r["ref_per_chunk"] - floor
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", default="floor,chat,messages")
    ap.add_argument("--chunks", default="8,200", help="the short and the long stream's chunks")
    ap.add_argument("--streams", type=int, default=5, help="streams counted of each length")
    ap.add_argument("--ref", help="also count the gateway at this git ref")
    ap.add_argument(
        "--keep", type=Path, help="keep each count's callgrind dump here (callgrind_annotate)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    args.paths = args.paths.split(",")
    short, long_ = (int(x) for x in args.chunks.split(","))
    args.chunks = (short, long_)
    rows = ov._arun(run(args))
    if args.json:
        print(json.dumps({"chunks": args.chunks, "streams": args.streams, "rows": rows}, indent=2))
        return
    head = f"{'path':<10}{'k instr/chunk':>15}{'added':>10}"
    if args.ref:
        head += f"{'at ' + args.ref[:10]:>16}{'added':>10}{'ratio':>8}"
    print(head)
    for r in rows:
        added = f"{r['added'] / 1e3:>10.2f}" if "added" in r else f"{'':>10}"
        line = f"{r['path']:<10}{r['per_chunk'] / 1e3:>15.2f}{added}"
        if "ref_per_chunk" in r:
            ref_added = f"{r['ref_added'] / 1e3:>10.2f}" if "ref_added" in r else f"{'':>10}"
            line += f"{r['ref_per_chunk'] / 1e3:>16.2f}{ref_added}"
            line += f"{r['per_chunk'] / r['ref_per_chunk']:>8.2f}"
        print(line)


if __name__ == "__main__":
    main()
