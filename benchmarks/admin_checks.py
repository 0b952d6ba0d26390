"""What counting admin credential checks in the store costs (admin_attempts.py): the same
``GET /metrics`` with the admin key, through the real app over loopback, on a gateway
whose checks are counted in its SQLite store (every worker and replica sees them) and on
one that counts them in memory (no store), measured in one run, alternating, so the
machine's load falls on both alike.

    python benchmarks/admin_checks.py [--requests 400]

Per gateway: the median and p90 time of a scrape with the right key and of one with a
wrong key (each wrong key from its own address, behind a trusted proxy, so no bound is
reached), and the ratios store / memory.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from prefixgate.config import parse_config
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread

ADMIN = "admin-key-of-the-benchmark"


def gateway(store: str | None) -> ServerThread:
    raw = {
        "channels": [{"name": "main", "base_url": "http://127.0.0.1:9/v1"}],
        "keys": [{"name": "k", "key_sha256": hashlib.sha256(b"client").hexdigest()}],
        "admin_key_sha256": hashlib.sha256(ADMIN.encode()).hexdigest(),
        "store": {"dsn": store, "journal_path": None} if store else None,
        "server": {"trusted_proxies": ["127.0.0.1"], "admin_failures_in_all_per_minute": 10**6},
    }
    return ServerThread(create_app(parse_config(raw))).start()


def timed(client: httpx.Client, key: str, address: str) -> float:
    headers = {"authorization": f"Bearer {key}", "x-forwarded-for": address}
    t0 = time.perf_counter()
    r = client.get("/metrics", headers=headers)
    spent = time.perf_counter() - t0
    assert r.status_code == (200 if key == ADMIN else 401), r.status_code
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=400)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        servers = {
            "store": gateway(f"sqlite:///{Path(tmp) / 'admin.db'}"),
            "memory": gateway(None),
        }
        clients = {k: httpx.Client(base_url=s.url) for k, s in servers.items()}
        times = {(k, what): [] for k in servers for what in ("right", "wrong")}
        try:
            for k in servers:  # warm: the store's migration, connections
                timed(clients[k], ADMIN, "198.51.100.1")
            for i in range(args.requests):
                for k in servers:
                    times[(k, "right")].append(timed(clients[k], ADMIN, "198.51.100.1"))
                    wrong = f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
                    times[(k, "wrong")].append(timed(clients[k], "guess", wrong))
        finally:
            for c in clients.values():
                c.close()
            for s in servers.values():
                s.stop()

    def q(xs: list[float], p: float) -> float:
        return statistics.quantiles(xs, n=100)[int(p) - 1] * 1000

    print(f"{args.requests} scrapes each, alternating; ms")
    print(f"{'gateway':8} {'key':6} {'median':>8} {'p90':>8}")
    for (k, what), xs in times.items():
        print(f"{k:8} {what:6} {statistics.median(xs) * 1000:8.2f} {q(xs, 90):8.2f}")
    for what in ("right", "wrong"):
        ratio = statistics.median(times[("store", what)]) / statistics.median(
            times[("memory", what)]
        )
        print(f"median store / memory, {what} key: {ratio:.2f}")


if __name__ == "__main__":
    main()
