"""The doctor against known cache breakers, end to end.

For each block size (16, 32, 64), template order (tools first, system first) and case of
:mod:`prefixgate.lab.traffic.breakers` (a healthy control and six breakers, all sessions from
one Claude Code version, no other traffic to compare with), a ``prefixgate upstream-sim``
process and a ``prefixgate serve --config`` process in front of it (billing-header strip
off; no ``render_order``: the gateway learns the template order from the simulator's
``/tokenize``, and the row says which order the recorded segments show) record the case's sessions into a store of their own; both are stopped and the
doctor reads the store. A case passes when a finding names
the expected class of change in the expected received segment, and the control passes
when nothing is critical and no breaker is reported.

    .venv/bin/python benchmarks/doctor_breakers.py [--sessions 4] [--turns 6]
        [--blocks 16,32,64] [--orders tools_first,system_first] [--cases clock,...]
        [--vllm-version 0.32] [--json]

Prints one row per run (``--json``: the rows and the doctor's findings as JSON); exits 1
when a case fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prefixgate.doctor import diagnose
from prefixgate.lab.incident import replay
from prefixgate.lab.traffic import breakers as bk
from prefixgate.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as ov  # noqa: E402

MODEL = "claude-opus-4-8"
UPSTREAM_MODEL = "sim-model"
PREFIXGATE = [sys.executable, "-m", "prefixgate.cli"]


@contextlib.contextmanager
def process(args: list[str], health: str, log: Path):
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        try:
            ov.wait_http(health, proc, timeout=30)
            yield proc
        finally:
            ov.stop(proc)


def config_text(upstream: str, dsn: str) -> str:
    return json.dumps(  # YAML is a superset of JSON
        {
            "channels": [
                {
                    "name": "vllm",
                    "kind": "openai",
                    "base_url": upstream,
                    "models": [MODEL],
                    "model_map": {MODEL: UPSTREAM_MODEL},
                    "strip_anthropic_billing_header": False,
                }
            ],
            "store": {"dsn": dsn},
        }
    )


def named(case: str, d) -> tuple[bool, dict | None]:
    """Whether the doctor named the case's breaker (the control: nothing critical, no
    breaker), and the finding's breaker facts."""
    want = bk.EXPECTED[case]
    found = [f.facts["breaker"] for f in d.findings if f.facts.get("breaker")]
    if want.cls is None:
        return (not d.critical and not found), (found[0] if found else None)
    for b in found:
        if b["class"] == want.cls and b["segment"] == want.segment and b["scope"] == want.scope:
            return True, b
    return False, (found[0] if found else None)


def run_case(case, block, order, upstream, spec, work: Path) -> dict:
    dsn = f"sqlite:///{work / f'{case}-{block}-{order}.db'}"
    cfg = work / f"{case}-{block}-{order}.yaml"
    cfg.write_text(config_text(upstream, dsn))
    port = ov.free_port()
    args = [*PREFIXGATE, "serve", "--config", str(cfg), "--port", str(port)]
    log = work / f"serve-{case}-{block}-{order}.log"
    t0 = time.monotonic()
    sessions = bk.sessions(case, spec)
    with process(args, f"http://127.0.0.1:{port}/healthz", log):
        url = f"http://127.0.0.1:{port}"
        asyncio.run(replay(url, sessions, len(sessions), lambda: None))
    d = diagnose(dsn)
    with open_store(dsn) as store:
        sent, failed = store.query(
            "SELECT COUNT(*), SUM(CASE WHEN status = 200 THEN 0 ELSE 1 END) FROM requests"
        )[0]
    with open_store(dsn) as store:
        first = next(iter(store.iter_records()))
    kinds = [s.kind for s in first.segments_out or first.segments_in or []]
    placed = "system_first" if kinds.index("system") < kinds.index("tool") else "tools_first"
    ok, b = named(case, d)
    finding = next((f for f in d.findings if f.facts.get("breaker") is b and b), None)
    prediction = finding.facts.get("prediction") if finding else None
    return {
        "case": case,
        "block": block,
        "order": order,
        "segments_placed": placed,
        "requests": sent,
        "failed": failed,
        "hit_rate": d.overall.get("hit_rate"),
        "named": ok and placed == order,
        "severity": finding.severity if finding else None,
        "class": b["class"] if b else None,
        "segment": b["segment"] if b else None,
        "scope": b["scope"] if b else None,
        "where": b["shape"] if b else None,
        "lost_share": b["lost_share"] if b else None,
        "predicted_rate": prediction["predicted_rate"] if prediction else None,
        "critical": d.critical,
        "titles": [f"[{f.severity}] {f.title}" for f in d.findings],
        "seconds": round(time.monotonic() - t0, 1),
    }


def pct(x) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def row_text(r: dict) -> str:
    expected = bk.EXPECTED[r["case"]]
    found = "-"
    if r["class"]:
        found = f"{r['class']} in {r['segment']}" + (
            " (across sessions)" if r["scope"] == "sessions" else ""
        )
    if expected.cls is None:
        found = "no breaker, nothing critical" if r["named"] else f"✗ {found}"
    return (
        f"| {r['case']} | {r['block']} | {r['order']} | {pct(r['hit_rate'])} | {found} | "
        f"{r['severity'] or '-'} | {pct(r['lost_share'])} | {pct(r['predicted_rate'])} | "
        f"{'✓' if r['named'] else '✗'} |"
    )


HEADER = (
    "| case | block | order | hit rate | doctor names | severity | tokens lost | "
    "predicted after fix | ok |\n|---|---|---|---|---|---|---|---|---|"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--blocks", default="16,32,64")
    ap.add_argument("--orders", default="tools_first,system_first")
    ap.add_argument("--cases", default=",".join(bk.CASES))
    ap.add_argument("--vllm-version", default="0.32")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    spec = bk.spec_for(sessions=args.sessions, turns=args.turns, models=(MODEL,))
    rows = []
    if not args.json:
        print(HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="doctor-breakers-") as tmp:
        work = Path(tmp)
        for block in (int(b) for b in args.blocks.split(",")):
            for order in args.orders.split(","):
                for case in args.cases.split(","):
                    # A simulator per case: no case warms the cache of the next.
                    port = ov.free_port()
                    sim = [
                        *PREFIXGATE,
                        "upstream-sim",
                        "--port",
                        str(port),
                        "--block-size",
                        str(block),
                        "--render-order",
                        order,
                        "--model",
                        UPSTREAM_MODEL,
                        "--vllm-version",
                        args.vllm_version,
                        "--max-model-len",
                        "1048576",
                    ]
                    health = f"http://127.0.0.1:{port}/health"
                    with process(sim, health, work / f"sim-{case}-{block}-{order}.log"):
                        upstream = f"http://127.0.0.1:{port}/v1"
                        r = run_case(case, block, order, upstream, spec, work)
                    rows.append(r)
                    print(
                        f"{case} block {block} {order}: {'ok' if r['named'] else 'NOT named'} "
                        f"({r['seconds']} s)",
                        file=sys.stderr,
                        flush=True,
                    )
                    if not args.json:
                        print(row_text(r), flush=True)
    if args.json:
        print(json.dumps({"vllm_version": args.vllm_version, "rows": rows}, indent=2))
    else:
        ok = sum(r["named"] for r in rows)
        print(f"\n{ok} of {len(rows)} runs named as expected (vLLM {args.vllm_version} usage)")
    return 0 if all(r["named"] for r in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
