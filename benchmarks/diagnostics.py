"""What asking "why did my cache miss?" costs on the request path, on a 100k-token request.

    python benchmarks/diagnostics.py [-n 200] [--instructions] [--json]

The request: the real Claude Code request of the fixtures, its conversation grown with
tool calls and results to ~100k tokens (chars / 4); the earlier turn is the same without
its last two messages, so the comparison walks every segment and finds no divergence
(its most expensive outcome: nothing stops the walk).

1. The comparison alone (``diagnostics.verdict.judge`` on the two records' segments, in
   process): p50 and p99 in microseconds over ``-n`` × 10 runs.
2. The gateway end to end (``prefixgate serve`` with the SQLite store, segment capture
   on, in front of ``overhead_upstream.py``; requests one at a time over loopback,
   without and with ``diagnostics``, interleaved): p50 latency of each and the
   difference. On a shared machine the difference is within the noise of a few tenths of
   a millisecond; the in-process figure is the comparison's own cost.
3. ``--instructions``: the same two requests under ``valgrind --tool=callgrind``
   (``instructions.py``'s method: counting on for ``-n`` requests after a warm-up):
   instructions per request without and with the field, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as ov  # noqa: E402

from prefixgate.diagnostics.verdict import judge  # noqa: E402
from prefixgate.record.cut import segments_from_bytes  # noqa: E402
from prefixgate.record.record import Diagnosis, Record  # noqa: E402

HERE = Path(__file__).resolve().parent
TOKENS = 100_000


def bodies() -> tuple[dict, dict]:
    """(earlier turn, this turn): ~100k tokens, this one appends an exchange."""
    anth, _ = ov.bodies()
    anth = {**anth, "stream": False}
    messages = list(anth["messages"])
    i = 0
    while len(json.dumps({**anth, "messages": messages})) < TOKENS * 4:
        call = f"toolu_{i:024d}"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Reading part {i} of the module."},
                    {
                        "type": "tool_use",
                        "id": call,
                        "name": "Read",
                        "input": {"path": f"src/m{i}.py"},
                    },
                ],
            }
        )
        text = "\n".join(
            f"    value_{i}_{k} = compute({k}, scale={i})  # step {k}" for k in range(40)
        )
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call, "content": text}],
            }
        )
        i += 1
    earlier = {**anth, "messages": messages[:-2]}
    return earlier, {**anth, "messages": messages}


def in_process(earlier: dict, now: dict, n: int) -> dict:
    """The comparison's own cost (segments as the capture computed them)."""
    segs = [segments_from_bytes(json.dumps(b).encode(), "anthropic") for b in (earlier, now)]
    prev = Record(request_id="a" * 32, received_at=0.0, requested_model="fake")
    prev.segments_in, prev.prompt_tokens = segs[0], TOKENS
    prev.diagnosis = Diagnosis(params={"thinking": "x", "tool_choice": "y"})
    cur = Record(request_id="b" * 32, received_at=0.0, requested_model="fake")
    cur.segments_in = segs[1]
    params = {"thinking": "x", "tool_choice": "y"}
    times = []
    for _ in range(n * 10):
        t0 = time.perf_counter_ns()
        v = judge(prev, cur, params, api="anthropic", tools_first=False)
        times.append(time.perf_counter_ns() - t0)
    assert v.answer == "none", v
    times.sort()
    return {
        "segments": len(segs[1]),
        "p50_us": times[len(times) // 2] / 1000,
        "p99_us": times[int(len(times) * 0.99)] / 1000,
    }


def _start(work: Path, valgrind: bool):
    up_port, port = ov.free_port(), ov.free_port()
    upstream = subprocess.Popen(
        [sys.executable, str(HERE / "overhead_upstream.py"), "--port", str(up_port)]
    )
    config = ov.gateway_config(port, f"http://127.0.0.1:{up_port}", work)
    config["server"]["busy_poll_us"] = 0
    config["server"]["shed_loop_lag"] = None
    config["limits"] = {"max_body_bytes": 8 * 1024 * 1024}
    (work / "config.json").write_text(json.dumps(config))
    cmd = [sys.executable, "-m", "prefixgate.cli", "serve", "--config", str(work / "config.json")]
    cmd += ["--log-level", "warning"]
    log = open(work / "gateway.log", "w")  # noqa: SIM115
    if valgrind:
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={work}/callgrind.out",
            *cmd,
        ]
    gateway = subprocess.Popen(cmd, stdout=log, stderr=log)
    ov.wait_http(f"http://127.0.0.1:{port}/healthz", gateway, timeout=600)
    return upstream, gateway, log, f"http://127.0.0.1:{port}/v1/messages"


def _stop(upstream, gateway, log) -> None:
    gateway.send_signal(signal.SIGTERM)
    gateway.wait(300)
    upstream.kill()
    upstream.wait()
    log.close()


def _payloads(client: httpx.Client, url: str, earlier: dict, now: dict) -> tuple[bytes, bytes]:
    """This turn's body without and with the field (naming the earlier turn's answer)."""
    headers = {"x-api-key": ov.KEY, "content-type": "application/json"}
    first = client.post(
        url,
        content=json.dumps({**earlier, "diagnostics": {"previous_message_id": None}}),
        headers=headers,
    )
    first.raise_for_status()
    plain = json.dumps(now).encode()
    asked = json.dumps({**now, "diagnostics": {"previous_message_id": first.json()["id"]}}).encode()
    check = client.post(url, content=asked, headers=headers).json()
    assert check["diagnostics"] is None and check["prefixgate_diagnostics"]["answer"] == "none"
    return plain, asked


HEADERS = {"x-api-key": ov.KEY, "content-type": "application/json"}


def end_to_end(earlier: dict, now: dict, n: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="prefixgate-diag-"))
    upstream, gateway, log, url = _start(work, valgrind=False)
    try:
        with httpx.Client(timeout=60) as client:
            plain, asked = _payloads(client, url, earlier, now)
            times: dict[str, list[float]] = {"without": [], "with": []}
            for i in range(n * 2 + 40):
                which, body = ("without", plain) if i % 2 == 0 else ("with", asked)
                t0 = time.perf_counter()
                r = client.post(url, content=body, headers=HEADERS)
                dt = time.perf_counter() - t0
                r.raise_for_status()
                if i >= 40:  # warm-up
                    times[which].append(dt * 1000)
    finally:
        _stop(upstream, gateway, log)
    p50 = {k: statistics.median(v) for k, v in times.items()}
    return {
        "body_bytes": len(plain),
        "p50_ms_without": p50["without"],
        "p50_ms_with": p50["with"],
        "p50_ms_difference": p50["with"] - p50["without"],
    }


def instructions(earlier: dict, now: dict, n: int, keep: Path | None = None) -> dict:
    out = {}
    for which in ("without", "with"):
        work = Path(tempfile.mkdtemp(prefix="prefixgate-diag-instr-"))
        upstream, gateway, log, url = _start(work, valgrind=True)
        try:
            with httpx.Client(timeout=600) as client:
                plain, asked = _payloads(client, url, earlier, now)
                body = plain if which == "without" else asked
                for _ in range(10):
                    client.post(url, content=body, headers=HEADERS).raise_for_status()
                toggle = ["callgrind_control", "-i"]
                subprocess.run([*toggle, "on", str(gateway.pid)], capture_output=True, check=True)
                for _ in range(n):
                    client.post(url, content=body, headers=HEADERS).raise_for_status()
                subprocess.run([*toggle, "off", str(gateway.pid)], capture_output=True, check=True)
        finally:
            _stop(upstream, gateway, log)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(work / "callgrind.out", keep / f"callgrind.{which}")
        m = re.search(r"Collected : (\d+)", (work / "gateway.log").read_text())
        if m is None:
            raise SystemExit(
                "no count from valgrind: " + (work / "gateway.log").read_text()[-2000:]
            )
        out[which] = int(m.group(1)) / n
    out["ratio"] = out["with"] / out["without"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200, help="requests per variant")
    ap.add_argument("--instructions", action="store_true", help="also count under callgrind")
    ap.add_argument(
        "--keep", type=Path, help="keep each variant's callgrind.out here (callgrind_annotate)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    earlier, now = bodies()
    result = {
        "request_tokens_estimate": len(json.dumps(now)) // 4,
        "comparison": in_process(earlier, now, args.n),
        "end_to_end": end_to_end(earlier, now, args.n),
        "cpus": os.cpu_count(),
    }
    if args.instructions:
        result["instructions"] = instructions(earlier, now, max(args.n // 10, 10), args.keep)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    c, e = result["comparison"], result["end_to_end"]
    print(
        f"request: ~{result['request_tokens_estimate']} tokens, {e['body_bytes']} bytes, {c['segments']} segments"
    )
    print(f"comparison alone: p50 {c['p50_us']:.1f} µs, p99 {c['p99_us']:.1f} µs")
    print(
        f"end to end: p50 {e['p50_ms_without']:.2f} ms without, {e['p50_ms_with']:.2f} ms with"
        f" ({e['p50_ms_difference']:+.2f} ms)"
    )
    if "instructions" in result:
        i = result["instructions"]
        print(
            f"instructions/request: {i['without'] / 1e6:.2f} M without, {i['with'] / 1e6:.2f} M"
            f" with (×{i['ratio']:.3f})"
        )


if __name__ == "__main__":
    main()
