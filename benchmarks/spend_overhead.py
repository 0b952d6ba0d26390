"""What budgets and telemetry cost a request: each step timed alone, and the gateway's
instructions per request with and without it.

    python benchmarks/spend_overhead.py                   # the steps alone (seconds)
    python benchmarks/spend_overhead.py --instructions    # and the gateway's counts (minutes)
    python benchmarks/spend_overhead.py --json

The steps, in this process (p50 and p99 of ``-n`` calls after a warm-up):

- ``budget reserve, memory``: the ``budget`` step's hold (``BudgetKeeper.reserve``) of a
  key with a token and a money budget and an owner with one, in one gateway's memory;
- ``budget reserve, Redis``: the same on the shared ledger (one script on 127.0.0.1:6379:
  a loopback round trip);
- ``budget settle``: what ``Exchange.finish`` does after the last byte (in memory: the
  ledger itself; with Redis it starts a task);
- ``telemetry span``: the span built from a finished record and handed to the batch
  processor (``Telemetry._span``, the part that runs on the event loop, with the comparison
  of a 63-segment prompt against the session's previous one), exporting to an OTLP/HTTP
  sink in this process;
- telemetry off: whether building an app without ``telemetry:`` imported
  ``prefixgate.telemetry`` or OpenTelemetry at all.

``--instructions`` counts, with ``instructions.py`` (callgrind, chat json, no store, one
request at a time), the gateway's user-space instructions per request: a key with no
budget (the base), the base with a price table (each record's cost, the spend counters),
the same with the key's and owner's budgets in memory and in Redis, and the base with
telemetry on (every trace sampled, the export thread counted too). Each figure is a ratio
to the base, and the budgets' also to prices alone (the budget step and its settlement):
what the step costs a request, free of this machine's timing noise.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import secrets
import shutil
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import instructions as instr  # noqa: E402
import overhead as ov  # noqa: E402

REDIS = "redis://127.0.0.1:6379/0"
PRICES = {"models": {"fake": {"input": 3.0, "cached_input": 0.3, "output": 15.0}}}
BUDGETS = ["1000000000 tokens/day", "100000 USD/month"]  # the key's
# Names of this run's own: the shared Redis keeps a window's counters past the run, and
# earlier runs' spending must not use up this run's budgets.
RUN = secrets.token_hex(4)
KEY_NAME, OWNER = f"bench-{RUN}", f"team-{RUN}"
OWNERS = {OWNER: ["100000 USD/month"]}


class Sink:
    """An OTLP/HTTP endpoint that takes every batch (200, empty answer)."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (the stdlib's name)
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def key_config(budgets: list[str]) -> dict:
    return {
        "name": KEY_NAME,
        "owner": OWNER,
        "key_sha256": hashlib.sha256(ov.KEY.encode()).hexdigest(),
        "budgets": budgets,
    }


def stats(samples: list[float]) -> dict:
    samples = sorted(samples)
    return {
        "p50_ms": round(statistics.median(samples) * 1e3, 4),
        "p99_ms": round(samples[int(len(samples) * 0.99) - 1] * 1e3, 4),
        "n": len(samples),
    }


def steps(n: int) -> list[dict]:
    """Each step timed alone in this process."""
    from prefixgate.config import parse_config
    from prefixgate.gateway import Gateway, NullRecorder
    from prefixgate.record import Record
    from prefixgate.record.record import Segment

    def gateway(shared: str | None) -> Gateway:
        raw = {
            "channels": [{"name": "fake", "base_url": "http://127.0.0.1:9/v1"}],
            "keys": [key_config(BUDGETS)],
            "prices": PRICES,
            "budgets": {"owners": OWNERS, "shared": shared},
        }
        return Gateway.from_config(parse_config(raw), recorder=NullRecorder())

    body = {"model": "fake", "max_tokens": 256, "messages": [{"role": "user", "content": "hi"}]}
    # a Claude-Code-sized prompt as the capture lists it: tools, system blocks, messages
    segs = [Segment("tool", f"tool{i}", f"t{i}", 2_000, 500) for i in range(20)]
    segs += [Segment("system", f"system[{i}]", f"s{i}", 4_000, 1_000) for i in range(3)]
    segs += [Segment("message", f"messages[{i}]:user", f"m{i}", 800, 200) for i in range(40)]
    rec = Record(
        request_id="r",
        received_at=time.time(),
        done_at=time.time() + 1,
        endpoint="/v1/chat/completions",
        requested_model="fake",
        upstream_model="fake",
        channel="fake",
        status=200,
        prompt_tokens=12000,
        cached_tokens=11520,
        completion_tokens=64,
        cost_nano=3_000_000,
        cost_saved_nano=31_000_000,
        session_id="s",
        key_name=KEY_NAME,
        key_owner=OWNER,
        ttft_ms=120.0,
        segments_in=segs,
    )
    rows = []

    async def budget_case(label: str, shared: str | None) -> None:
        gw = gateway(shared)
        keeper = gw.budgets
        principal = gw.auth.authenticate({"authorization": f"Bearer {ov.KEY}"})
        reserve, settle = [], []
        for i in range(n + n // 10):
            t0 = time.perf_counter()
            hold, _ = await keeper.reserve(f"h{i}", principal, 50_000, body, "fake")
            t1 = time.perf_counter()
            keeper.settle(hold, rec)
            t2 = time.perf_counter()
            await asyncio.gather(*keeper._tasks)
            if i >= n // 10:
                reserve.append(t1 - t0)
                settle.append(t2 - t1)
        await keeper.aclose()
        rows.append({"step": f"budget reserve, {label}", **stats(reserve)})
        if shared is None:
            rows.append({"step": "budget settle, memory", **stats(settle)})

    print("budget steps …", file=sys.stderr, flush=True)
    asyncio.run(budget_case("memory", None))
    try:
        asyncio.run(budget_case("Redis", REDIS))
    except Exception as exc:  # no Redis here
        print(f"budget reserve, Redis: skipped ({exc})", file=sys.stderr)

    print("telemetry span …", file=sys.stderr, flush=True)
    from prefixgate.config import TelemetryConfig
    from prefixgate.telemetry import Telemetry

    sink = Sink()
    tel = Telemetry(TelemetryConfig(otlp_endpoint=sink.url), gateway(None).config.channels)
    spans = []
    for i in range(n + n // 10):
        t0 = time.perf_counter()
        tel._span(rec, None)
        if i >= n // 10:
            spans.append(time.perf_counter() - t0)
        if i % 512 == 0:
            time.sleep(0.01)  # let the batch thread drain, as between requests
    tel.force_flush()
    exported = tel.exporter.exported
    tel.shutdown()
    sink.close()
    rows.append({"step": "telemetry span (on the loop)", **stats(spans), "exported": exported})
    return rows


def telemetry_off() -> dict:
    """Whether an app without ``telemetry:`` loads OpenTelemetry (in a fresh interpreter)."""
    code = (
        "import sys\n"
        "from prefixgate.config import parse_config\n"
        "from prefixgate.gateway import NullRecorder\n"
        "from prefixgate.serve.app import create_app\n"
        "create_app(parse_config({'channels': [{'name': 'c', 'base_url': 'http://127.0.0.1:9/v1'}]}), recorder=NullRecorder())\n"
        "print(any(m == 'prefixgate.telemetry' or m.startswith('opentelemetry') for m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        return {"step": "telemetry off", "error": out.stderr.strip().splitlines()[-1:]}
    return {"step": "telemetry off", "opentelemetry_imported": out.stdout.strip() == "True"}


def counts(n: int) -> list[dict]:
    """Instructions per request of the gateway (chat json, no store), per setting."""
    anth, chat = instr.ov.bodies()
    sink = Sink()
    settings = {
        "base (a key, no budget)": [f"keys={json.dumps([key_config([])])}"],
        "prices (cost on each record, spend counters)": [
            f"keys={json.dumps([key_config([])])}",
            f"prices={json.dumps(PRICES)}",
        ],
        "budgets in memory": [
            f"keys={json.dumps([key_config(BUDGETS)])}",
            f"prices={json.dumps(PRICES)}",
            f"budgets={json.dumps({'owners': OWNERS})}",
        ],
        "budgets in Redis": [
            f"keys={json.dumps([key_config(BUDGETS)])}",
            f"prices={json.dumps(PRICES)}",
            f"budgets={json.dumps({'owners': OWNERS, 'shared': REDIS})}",
        ],
        "telemetry on (ratio 1)": [
            f"keys={json.dumps([key_config([])])}",
            f"telemetry={json.dumps({'otlp_endpoint': sink.url})}",
        ],
    }
    rows = []
    try:
        for label, sets in settings.items():
            print(f"counting {label} …", file=sys.stderr, flush=True)
            m = instr.count(("chat", False, False), n, None, anth, chat, None, tuple(sets))
            rows.append({"setting": label, "instructions": m})
    finally:
        sink.close()
    base, priced = rows[0]["instructions"], rows[1]["instructions"]
    for r in rows:
        r["ratio"] = round(r["instructions"] / base, 4)
        if r["setting"].startswith("budgets"):  # the budget step alone: against prices
            r["ratio_to_prices"] = round(r["instructions"] / priced, 4)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=20_000, help="calls per step timed")
    ap.add_argument("--instructions", action="store_true", help="also count the gateway's")
    ap.add_argument("--count-n", type=int, default=300, help="requests counted per setting")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = {"steps": [*steps(args.n), telemetry_off()]}
    if args.instructions:
        if shutil.which("valgrind") is None:
            raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
        out["instructions"] = counts(args.count_n)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print("| step | p50 | p99 |\n| --- | ---: | ---: |")
    for r in out["steps"]:
        if "p50_ms" in r:
            print(f"| {r['step']} | {r['p50_ms']:.4f} ms | {r['p99_ms']:.4f} ms |")
        else:
            print(f"| {r['step']} | {json.dumps({k: v for k, v in r.items() if k != 'step'})} | |")
    if "instructions" in out:
        print(
            "\n| setting | M instructions a request | ratio to the base | ratio to prices |"
            "\n| --- | ---: | ---: | ---: |"
        )
        for r in out["instructions"]:
            to_prices = f"{r['ratio_to_prices']:.3f}" if "ratio_to_prices" in r else ""
            print(
                f"| {r['setting']} | {r['instructions'] / 1e6:.3f} | {r['ratio']:.3f} |"
                f" {to_prices} |"
            )


if __name__ == "__main__":
    main()
