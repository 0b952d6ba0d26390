"""The gateway's own cost, side by side with the LiteLLM proxy, in one run.

    python benchmarks/overhead.py [--repeats 3] [--seconds 3] [--json] [--no-litellm]
                                  [--workers N] [--servers] [--floor]

Starts a fast fake OpenAI upstream (`overhead_upstream.py`) and measures, against it:
``direct`` (the upstream itself), ``prefixgate`` (`prefixgate serve --config …`, SQLite
store with segment capture, so recording is included), ``prefixgate-nostore`` (no store)
with ``--floor`` a do-nothing proxy with and without busy polling (``floor``,
``floor-nopoll``: what the hop alone adds, ``overhead_floor.py``),
and ``litellm`` (the LiteLLM proxy, installed by this script into
``~/.cache/prefixgate/litellm-<version>``), for ``/v1/chat/completions`` and
``/v1/messages`` (the real Claude Code request in ``tests/fixtures/claude-code`` as the
body; the chat body is that request converted to Chat Completions), streaming and not,
at concurrency 1 and 32, and a 256-chunk stream (the per-chunk relay cost).

Placement: each gateway is one process (one worker) pinned to core 0; the fake upstream
and the load generator (this process) share core 1. Each repeat starts every gateway
afresh; figures are the median over repeats, and "added" figures are the gateway minus
the direct path of the same repeat. Resident memory (VmRSS) is read after each run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead_load as load  # noqa: E402

from prefixgate.apis.messages.request import ConvertOptions, anthropic_to_openai  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LITELLM_VERSION = "1.108.7"
FIXTURE_NAMES = ("01_v2.1.332_print_turn1.json",)
GATEWAY_CPU, LOAD_CPU = 0, 1
KEY = "sk-bench-0123456789abcdef0123456789abcdef"  # LiteLLM refuses to start without one
LONG_CHUNKS = 256
BUSY_POLL_US = 200  # the gateway's default (server.busy_poll_us), for the floor proxy


# -- processes ---------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pinned(cpu: int | None):
    return None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (worker processes)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def rss_mib(pid: int) -> float:
    total = 0
    for p in tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process and its children."""
    tick = os.sysconf("SC_CLK_TCK")
    user = system = 0
    for p in tree(pid):
        try:
            f = (Path(f"/proc/{p}/stat")).read_text().rsplit(")", 1)[1].split()
            user, system = user + int(f[11]), system + int(f[12])
        except (OSError, IndexError):
            pass
    return user / tick, system / tick


def cpu_seconds(pid: int) -> float:
    return sum(cpu_times(pid))


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def litellm_bin(version: str) -> Path:
    """The LiteLLM proxy in its own venv under ~/.cache/prefixgate (installed once)."""
    venv = Path.home() / ".cache" / "prefixgate" / f"litellm-{version}"
    exe = venv / "bin" / "litellm"
    if not exe.exists():
        print(f"installing litellm[proxy]=={version} into {venv} …", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", f"litellm[proxy]=={version}"],
            check=True,
        )
    return exe


def gateway_config(port: int, upstream: str, store_dir: Path | None, name: str = "pg") -> dict:
    """The config of a prefixgate under test: loopback, one channel to the fake upstream,
    and the SQLite store (segment capture on, its default) in ``store_dir``, or none."""
    store = None
    if store_dir is not None:
        store = {
            "dsn": f"sqlite:///{store_dir}/{name}.db",
            "journal_path": str(store_dir / f"{name}.journal"),
        }
    return {
        "server": {"host": "127.0.0.1", "port": port},
        "channels": [{"name": "fake", "base_url": f"{upstream}/v1"}],
        "store": store,
    }


class Gateway:
    """One gateway under test: how to start it and where it listens."""

    def __init__(self, name: str, work: Path, upstream: str, args) -> None:
        self.name, self.work, self.upstream, self.args = name, work, upstream, args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def command(self) -> tuple[list[str], dict, str]:
        if self.name == "litellm":
            cfg = self.work / "litellm.yaml"
            models = "".join(
                f"  - model_name: {m}\n    litellm_params:\n      model: hosted_vllm/{m}\n"
                f"      api_base: {self.upstream}/v1\n      api_key: sk-fake\n"
                for m in ("fake", "fake-long")
            )
            cfg.write_text(
                f"model_list:\n{models}litellm_settings:\n  telemetry: false\n  drop_params: true\n"
                f"general_settings:\n  master_key: {KEY}\n"
            )
            env = {
                **os.environ,
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "LITELLM_LOG": "ERROR",
                "DISABLE_SCHEMA_UPDATE": "true",
            }
            exe = litellm_bin(self.args.litellm_version)
            cmd = [str(exe), "--config", str(cfg), "--port", str(self.port), "--num_workers", "1"]
            return cmd, env, "/health/liveliness"
        if self.name.startswith("floor"):
            poll = "0" if self.name == "floor-nopoll" else str(BUSY_POLL_US)
            cmd = [sys.executable, str(HERE / "overhead_floor.py"), "--port", str(self.port)]
            cmd += ["--upstream-port", self.upstream.rsplit(":", 1)[1], "--busy-poll-us", poll]
            return cmd, dict(os.environ), "/health"
        store = self.work if self.name == "prefixgate" else None
        cfg = self.work / f"{self.name}.json"
        cfg.write_text(json.dumps(gateway_config(self.port, self.upstream, store, self.name)))
        exe = Path(sys.executable).parent / "prefixgate"
        cmd = [str(exe), "serve", "--config", str(cfg), "--log-level", "warning"]
        if self.name == "prefixgate-uvicorn":
            cmd += ["--http", "uvicorn"]
        if self.args.workers > 1:
            cmd += ["--workers", str(self.args.workers)]
        return cmd, dict(os.environ), "/healthz"

    def start(self) -> None:
        cmd, env, health = self.command()
        cpu = None if self.args.workers > 1 else GATEWAY_CPU
        self.log = open(self.work / f"{self.name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=pinned(cpu)
        )
        wait_http(self.url + health, self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.log.close()


def _arun(coro):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


# -- cases -------------------------------------------------------------------------------
def bodies() -> tuple[dict, dict]:
    """(anthropic, chat): the Claude Code request, and the same converted to Chat."""
    path = ROOT / "tests" / "fixtures" / "claude-code" / FIXTURE_NAMES[0]
    body = json.loads(path.read_text())["body"]
    body = json.loads(body) if isinstance(body, str) else body
    body = {**body, "model": "fake"}
    chat = anthropic_to_openai(body, ConvertOptions(upstream_model="fake"))
    chat.pop("stream_options", None)
    return body, chat


def cases() -> list[tuple[str, bool, int, str]]:
    """(endpoint, stream, concurrency, model)."""
    out = []
    for endpoint in ("chat", "messages"):
        for stream in (False, True):
            for conc in (1, 32):
                out.append((endpoint, stream, conc, "fake"))
        out.append((endpoint, True, 1, "fake-long"))
    return out


def case_name(c) -> str:
    endpoint, stream, conc, model = c
    kind = "stream" if stream else "json"
    if model.endswith("-long"):
        kind = f"stream{LONG_CHUNKS}"
    return f"{endpoint}/{kind}/c{conc}"


def request_of(target: str, url: str, case, anth: dict, chat: dict):
    endpoint, stream, _, model = case
    if target == "direct" or endpoint == "chat":
        body = {**chat, "model": model, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        path = "/v1/chat/completions"
        headers = {"authorization": f"Bearer {KEY}"}
    else:
        body = {**anth, "model": model, "stream": stream}
        path = "/v1/messages"
        headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    return url + path, json.dumps(body).encode(), headers


def latency_ms(res) -> tuple[float | None, float | None, float | None]:
    """p50 and p99 latency and p50 time to first token of a load run, in ms (None if no
    request completed)."""
    lat, ttft = sorted(res.latencies), sorted(res.ttfts)
    n = len(lat)
    if not n:
        return None, None, None
    first = 1000 * ttft[len(ttft) // 2] if ttft else None
    return 1000 * lat[n // 2], 1000 * lat[min(n - 1, int(n * 0.99))], first


async def measure(target: str, url: str, anth: dict, chat: dict, args, pid: int | None) -> dict:
    out = {}
    for case in cases():
        u, body, headers = request_of(target, url, case, anth, chat)
        seconds = args.seconds if case[2] > 1 else args.seconds * 0.7
        cpu0 = cpu_seconds(pid) if pid else 0.0
        res = await load.run(u, body, headers, concurrency=case[2], seconds=seconds)
        cpu = cpu_seconds(pid) - cpu0 if pid else 0.0
        n = len(res.latencies)
        p50, p99, ttft = latency_ms(res)
        out[case_name(case)] = {
            "rps": res.rps,
            "p50_ms": p50,
            "p99_ms": p99,
            "ttft_p50_ms": ttft,
            "errors": res.errors,
            "n": n,
            "cpu_ms_per_req": 1000 * cpu / n if (pid and n) else None,
        }
        if res.errors:
            print(f"  {target} {case_name(case)}: {res.errors} errors", file=sys.stderr)
    return out


def run_all(args) -> dict:
    anth, chat = bodies()
    work = Path(tempfile.mkdtemp(prefix="prefixgate-overhead-"))
    os.sched_setaffinity(0, {LOAD_CPU})
    up_port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, str(HERE / "overhead_upstream.py"), "--port", str(up_port)],
        preexec_fn=pinned(LOAD_CPU),
    )
    up_url = f"http://127.0.0.1:{up_port}"
    targets = ["direct", "prefixgate", "prefixgate-nostore"]
    if args.servers:
        targets.append("prefixgate-uvicorn")
    if args.floor:
        targets += ["floor", "floor-nopoll"]
    if not args.no_litellm:
        litellm_bin(args.litellm_version)
        targets.append("litellm")
    runs: dict[str, list[dict]] = {t: [] for t in targets}
    try:
        wait_http(up_url + "/health", upstream)
        for rep in range(args.repeats):
            for t in targets:
                print(f"repeat {rep + 1}/{args.repeats}: {t}", file=sys.stderr)
                if t == "direct":
                    result = _arun(measure(t, up_url, anth, chat, args, None))
                    runs[t].append({"cases": result})
                    continue
                gw = Gateway(t, work, up_url, args)
                gw.start()
                try:
                    # Warm-up (imports, connection pools, first-call paths).
                    _arun(_warm(gw.url, t, anth, chat))
                    result = _arun(measure(t, gw.url, anth, chat, args, gw.proc.pid))
                    runs[t].append({"cases": result, "rss_mib": rss_mib(gw.proc.pid)})
                finally:
                    gw.stop()
    finally:
        stop(upstream)
        shutil.rmtree(work, ignore_errors=True)
    return summarize(runs)


async def _warm(url: str, target: str, anth: dict, chat: dict) -> None:
    for case in cases():
        u, body, headers = request_of(target, url, case, anth, chat)
        await load.run(u, body, headers, concurrency=min(case[2], 4), seconds=0.2, warmup=0.0)


# -- summary -----------------------------------------------------------------------------
def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs: dict[str, list[dict]]) -> dict:
    direct = runs["direct"]
    summary: dict = {"targets": {}, "chunks_long": LONG_CHUNKS}
    for t, reps in runs.items():
        cases_out = {}
        for name in reps[0]["cases"]:
            per = [r["cases"][name] for r in reps]
            row = {k: _med([p[k] for p in per]) for k in per[0] if k != "n"}
            if t != "direct":
                d = [r["cases"][name] for r in direct]
                row["added_p50_ms"] = _med(
                    [p["p50_ms"] - q["p50_ms"] for p, q in zip(per, d, strict=True) if p["p50_ms"]]
                )
                row["added_p99_ms"] = _med(
                    [p["p99_ms"] - q["p99_ms"] for p, q in zip(per, d, strict=True) if p["p99_ms"]]
                )
                if "/stream" in name:
                    row["added_ttft_ms"] = _med(
                        [
                            p["ttft_p50_ms"] - q["ttft_p50_ms"]
                            for p, q in zip(per, d, strict=True)
                            if p["ttft_p50_ms"]
                        ]
                    )
                if f"stream{LONG_CHUNKS}" in name and row["added_p50_ms"] is not None:
                    row["per_chunk_us"] = 1000 * row["added_p50_ms"] / LONG_CHUNKS
            cases_out[name] = row
        summary["targets"][t] = {
            "cases": cases_out,
            "rss_mib": _med([r.get("rss_mib") for r in reps]),
            "repeats": len(reps),
        }
    return summary


def _f(v, fmt="{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def table(summary: dict) -> str:
    ts = summary["targets"]
    gws = [t for t in ts if t != "direct"]
    lines = []
    head = f"{'case':<24}{'direct rps':>11}" + "".join(
        f"{t + ' rps':>22}{'+p50':>8}{'+p99':>8}{'+ttft':>8}" for t in gws
    )
    lines.append(head)
    for name in ts["direct"]["cases"]:
        row = f"{name:<24}{_f(ts['direct']['cases'][name]['rps'], '{:.0f}'):>11}"
        for t in gws:
            c = ts[t]["cases"][name]
            row += f"{_f(c['rps'], '{:.0f}'):>22}{_f(c.get('added_p50_ms')):>8}"
            row += f"{_f(c.get('added_p99_ms')):>8}{_f(c.get('added_ttft_ms')):>8}"
        lines.append(row)
    lines.append("")
    for t in gws:
        per_chunk = [
            c.get("per_chunk_us") for n, c in ts[t]["cases"].items() if c.get("per_chunk_us")
        ]
        cpu = {n: c.get("cpu_ms_per_req") for n, c in ts[t]["cases"].items()}
        lines.append(
            f"{t}: RSS {_f(ts[t]['rss_mib'], '{:.0f}')} MiB; per-chunk relay "
            + ", ".join(f"{v:.1f} µs" for v in per_chunk)
            + "; CPU ms/request at c32: "
            + ", ".join(f"{n.split('/c')[0]} {_f(v)}" for n, v in cpu.items() if n.endswith("c32"))
        )
    if "litellm" in ts:
        lines.append("")
        lines.append("ratios, prefixgate (with store) vs litellm:")
        pg, ll = ts["prefixgate"]["cases"], ts["litellm"]["cases"]
        for name in pg:
            r = pg[name]["rps"] / ll[name]["rps"] if ll[name]["rps"] else None
            a = (
                ll[name]["added_p50_ms"] / pg[name]["added_p50_ms"]
                if pg[name].get("added_p50_ms") and ll[name].get("added_p50_ms")
                else None
            )
            lines.append(
                f"  {name:<24} throughput {_f(r, '{:.1f}')}x   added p50 {_f(a, '{:.1f}')}x smaller"
            )
        rr = ts["litellm"]["rss_mib"] / ts["prefixgate"]["rss_mib"]
        lines.append(f"  resident memory: {rr:.1f}x smaller")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="measured seconds per case")
    ap.add_argument("--no-litellm", action="store_true", help="skip the LiteLLM proxy")
    ap.add_argument("--litellm-version", default=LITELLM_VERSION)
    ap.add_argument("--workers", type=int, default=1, help="prefixgate worker processes")
    ap.add_argument(
        "--servers",
        action="store_true",
        help="also prefixgate (no store) on uvicorn (`serve --http uvicorn`), to compare servers",
    )
    ap.add_argument(
        "--floor",
        action="store_true",
        help="also a do-nothing proxy (overhead_floor.py), with and without busy polling: "
        "what the hop alone adds",
    )
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args()
    summary = run_all(args)
    summary["workers"] = args.workers
    print(json.dumps(summary, indent=2) if args.json else table(summary))


if __name__ == "__main__":
    main()
