"""Budgets under concurrency: two gateways (two `prefixgate serve` processes) share one
budget through Redis (127.0.0.1:6379); 64 clients stream against it at once, alternating
gateways, each until the budget refuses it for good.

    python benchmarks/budget.py                 # every case
    python benchmarks/budget.py --case money --json

The fake upstream (``overhead_upstream.py``) answers each stream with the same usage (12,000
prompt tokens of which 11,520 cached, 64 out, over 3.2 s), so every request costs the same
and the budget is set to allow exactly 100 of them. The request bodies are sized so the
gateway's estimate (its prompt at ~4 bytes a token, plus ``max_tokens``) is:

- ``money``: a money budget (the estimate prices every prompt token as fresh input: about
  6.5 times the real cost, so holds are conservative);
- ``tokens``: a token budget, the estimate equal to the real charge;
- ``tokens-low``: a token budget, the estimate 20% below the real charge (the case that
  can overshoot).

A client refused because the budget is held by requests in flight (429 rate_limit_error)
waits 50 ms and asks again; refused as spent (429 insufficient_quota) it stops; a
connection error (a kept-alive connection the gateway closed as it was reused) is counted
and the request sent again (what was admitted is read from the records, not the clients). Per case:
the requests admitted, the settled figure in Redis against the limit (the overshoot), the
bound — the estimates of the requests in flight when the last one was admitted, itself
included — and whether the settled figure equals the sum of both gateways' records' costs.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as ov  # noqa: E402

from prefixgate.spend.prices import Price  # noqa: E402
from prefixgate.store import open_store  # noqa: E402

REDIS = "redis://127.0.0.1:6379/0"
PROMPT, CACHED, OUT = 12_000, 11_520, 64  # the fake upstream's usage of a -slow stream
PRICE = {"input": 1.0, "cached_input": 0.1, "output": 4.0}
CLIENTS = 64
ALLOWED = 100
CASES = {"money": 1.0, "tokens": 1.0, "tokens-low": 0.8}  # estimate / real prompt


def body_of(prompt_tokens: int) -> bytes:
    """A chat stream request whose bytes are ~4 per estimated prompt token."""
    skeleton = {"model": "fake-slow", "stream": True, "max_tokens": OUT, "messages": []}
    base = len(json.dumps({**skeleton, "messages": [{"role": "user", "content": ""}]}))
    text = "x" * (prompt_tokens * 4 - base)
    out = json.dumps({**skeleton, "messages": [{"role": "user", "content": text}]}).encode()
    assert len(out) // 4 == prompt_tokens, len(out)
    return out


def run_case(name: str, work: Path, upstream: str) -> dict:
    money = name == "money"
    price = Price.of(**PRICE)
    real = price.cost(PROMPT - CACHED, CACHED, 0, OUT) if money else PROMPT + OUT
    est_prompt = int(PROMPT * CASES[name])
    estimate = price.cost(est_prompt, 0, 0, OUT) if money else est_prompt + OUT
    limit_units = ALLOWED * real
    key_name = f"bench-{name}-{secrets.token_hex(4)}"
    secret = "pg-" + secrets.token_hex(16)
    budget = f"{limit_units / 1e9:.9f} USD/day" if money else f"{limit_units} tokens/day"
    gateways = []
    for i in range(2):
        cfg = ov.gateway_config(ov.free_port(), upstream, work, f"{name}-{i}")
        cfg["keys"] = [
            {
                "name": key_name,
                "key_sha256": hashlib.sha256(secret.encode()).hexdigest(),
                "budgets": [budget],
            }
        ]
        cfg["budgets"] = {"shared": REDIS}
        if money:
            cfg["prices"] = {"models": {"fake-slow": PRICE}}
        path = work / f"{name}-{i}.json"
        path.write_text(json.dumps(cfg))
        exe = Path(sys.executable).parent / "prefixgate"
        log = open(work / f"{name}-{i}.log", "ab")  # noqa: SIM115
        proc = ov.subprocess.Popen(
            [str(exe), "serve", "--config", str(path), "--log-level", "warning"],
            stdout=log,
            stderr=ov.subprocess.STDOUT,
            preexec_fn=ov.pinned(i % 2),
        )
        url = f"http://127.0.0.1:{cfg['server']['port']}"
        ov.wait_http(url + "/healthz", proc)
        gateways.append((url, proc, log, cfg["store"]["dsn"]))

    print(f"{name}: 2 gateways up, {CLIENTS} clients against {budget}", file=sys.stderr)
    data = body_of(est_prompt)
    counts = {"admitted": 0, "held": 0, "spent": 0, "other": 0, "transport": 0}

    async def client(i: int, http: httpx.AsyncClient) -> None:
        url = gateways[i % 2][0] + "/v1/chat/completions"
        headers = {"authorization": f"Bearer {secret}", "content-type": "application/json"}
        while True:
            try:
                async with http.stream("POST", url, content=data, headers=headers) as r:
                    body = await r.aread()
            except httpx.TransportError:  # a kept-alive connection closed as it was reused
                counts["transport"] += 1
                continue
            if r.status_code == 200:
                counts["admitted"] += 1
                continue
            code = json.loads(body)["error"].get("code") if r.status_code == 429 else None
            if code == "insufficient_quota":
                counts["spent"] += 1
                return
            counts["held" if r.status_code == 429 else "other"] += 1
            if r.status_code != 429:
                return
            await asyncio.sleep(0.05)

    async def load() -> float:
        limits = httpx.Limits(max_connections=CLIENTS * 2)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:
            t0 = time.perf_counter()
            await asyncio.gather(*(client(i, http) for i in range(CLIENTS)))
            return time.perf_counter() - t0

    seconds = asyncio.run(load())
    print(f"{name}: {counts} in {seconds:.1f} s; stopping the gateways", file=sys.stderr)
    for _, proc, log, _ in gateways:
        ov.stop(proc)  # SIGTERM: each gateway stores what it recorded, settles what it held
        log.close()
    records = []
    for *_, dsn in gateways:
        with open_store(dsn) as store:
            records += list(store.iter_records())
    ok = [r for r in records if r.status == 200]
    charge = [
        (r.cost_nano or 0) if money else (r.prompt_tokens or 0) + (r.completion_tokens or 0)
        for r in records
    ]

    async def settled() -> tuple[int, int]:
        from prefixgate.spend.counters import RedisCounters

        day = time.strftime("%Y-%m-%d", time.gmtime())
        unit = "USD" if money else "tokens"
        led = RedisCounters(REDIS)
        try:
            [(spent, held)] = await led.read([f"key:{key_name}:{unit}:day:{day}"])
            return spent, held
        finally:
            await led.aclose()

    spent, held = asyncio.run(settled())
    last = max(r.received_at for r in ok)
    in_flight = [r for r in ok if r.received_at <= last < (r.done_at or last)]
    in_flight_n = max(
        1, len(in_flight) + (0 if any(r.received_at == last for r in in_flight) else 1)
    )
    return {
        "case": name,
        "budget": budget,
        "limit": limit_units,
        "unit": "nanos USD" if money else "tokens",
        "real_per_request": real,
        "estimate_per_request": estimate,
        "clients": CLIENTS,
        "admitted": len(ok),
        "refused_held": counts["held"],
        "refused_spent": counts["spent"],
        "other": counts["other"],
        "transport_errors": counts["transport"],
        "settled": spent,
        "held_after": held,
        "records_sum": sum(charge),
        "settled_equals_records": spent == sum(charge),
        "overshoot": spent - limit_units,
        "in_flight_at_last_admission": in_flight_n,
        "bound": in_flight_n * estimate,
        "within_bound": spent - limit_units <= in_flight_n * estimate,
        "seconds": round(seconds, 2),
    }


def table(rows: list[dict]) -> str:
    head = (
        "| case | budget | admitted | overshoot | bound (in flight × estimate) | settled = Σ records |"
        " refused (held / spent) |\n| --- | --- | --- | --- | --- | --- | --- |"
    )
    lines = [head]
    for r in rows:
        unit = r["unit"]
        lines.append(
            f"| {r['case']} | {r['budget']} | {r['admitted']} | {r['overshoot']:,} {unit} "
            f"({r['overshoot'] / r['real_per_request']:+.2f} requests) | "
            f"{r['in_flight_at_last_admission']} × {r['estimate_per_request']:,} = {r['bound']:,} | "
            f"{'yes' if r['settled_equals_records'] else 'NO'} ({r['settled']:,}) | "
            f"{r['refused_held']} / {r['refused_spent']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", choices=list(CASES))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="prefixgate-budget-"))
    port = ov.free_port()
    upstream = ov.subprocess.Popen(
        [sys.executable, str(ov.HERE / "overhead_upstream.py"), "--port", str(port)]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        ov.wait_http(url + "/health", upstream)
        rows = [run_case(c, work, url) for c in (args.case or list(CASES))]
    finally:
        ov.stop(upstream)
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    if not all(r["settled_equals_records"] and r["within_bound"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
