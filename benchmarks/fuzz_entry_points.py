"""Property-based fuzz of every entry point's body, against a real gateway on loopback in
front of the simulated upstream (both in this process, each on its own port).

Each case is one POST to ``/v1/messages``, ``/v1/messages/count_tokens``,
``/v1/chat/completions`` or ``/v1/responses`` with a body hypothesis draws: arbitrary
JSON values, objects with the protocol's own field names holding arbitrary values, and
arbitrary bytes (including bytes that are not UTF-8 and JSON with lone surrogates). What
must hold for every case:

- never a 5xx from the gateway itself (a 5xx is only allowed when the record says the
  upstream failed, which the simulated upstream never does here);
- every 4xx in the protocol's error shape (Anthropic's on the Messages routes, OpenAI's
  on the others);
- a record for every request, with a status equal to the answer's;
- after the run, the gateway still answers ``/healthz``, and its process' resident memory
  has grown by less than ``--rss-bound-mb``.

``python benchmarks/fuzz_entry_points.py --cases 100000`` prints the figures
(docs/reliability.md has a run); tests/security/test_fuzz.py runs the same properties at a
size that fits the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROUTES = {
    "/v1/messages": "anthropic",
    "/v1/messages/count_tokens": "anthropic",
    "/v1/chat/completions": "openai",
    "/v1/responses": "openai",
}
FIELDS = {
    "/v1/messages": ("model", "max_tokens", "messages", "system", "tools", "stream", "thinking"),
    "/v1/messages/count_tokens": ("model", "messages", "system", "tools"),
    "/v1/chat/completions": (
        "model",
        "messages",
        "tools",
        "stream",
        "max_tokens",
        "temperature",
        "n",
        "stream_options",
    ),
    "/v1/responses": (
        "model",
        "input",
        "instructions",
        "tools",
        "stream",
        "max_output_tokens",
        "reasoning",
    ),
}

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=24)
    | st.sampled_from(["m", "user", "assistant", "text", "function", "\ud800", "\udc00x"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["role", "content", "type", "text", "name", "function", "parameters"])
            | st.text(max_size=8),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool", "x"])},
        optional={"content": st.text(max_size=16) | json_values},
    ),
    max_size=4,
)


def _dumps(value) -> bytes:
    # surrogatepass: a lone surrogate drawn as text is sent as its UTF-8-ish bytes, which
    # the gateway must refuse like any other bytes that are not UTF-8
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


def bodies(route: str) -> st.SearchStrategy[bytes]:
    names = FIELDS[route]
    shaped = st.fixed_dictionaries(
        {},
        optional={
            n: (
                messages
                if n in ("messages", "input")
                else st.just("m")
                if n == "model"
                else json_values
            )
            | json_values
            for n in names
        },
    )
    escaped = shaped.map(lambda v: json.dumps(v).encode())  # \\ud800 as a JSON escape
    valid = st.text(max_size=40).map(lambda t: _dumps(_valid(route, t)))
    return st.one_of(
        valid,
        shaped.map(_dumps),
        escaped,
        json_values.map(_dumps),
        st.binary(max_size=256),
        st.tuples(shaped.map(_dumps), st.binary(min_size=1, max_size=4)).map(
            lambda t: t[0][:-1] + t[1] + t[0][-1:]
        ),
    )


def _valid(route: str, text: str) -> dict:
    """A request the route serves, around ``text`` (which may hold a lone surrogate)."""
    if route == "/v1/responses":
        return {"model": "m", "input": text or "x", "max_output_tokens": 4}
    body = {"model": "m", "messages": [{"role": "user", "content": text or "x"}]}
    return body if route.endswith("count_tokens") else {**body, "max_tokens": 4}


def shape_ok(protocol: str, body: bytes) -> bool:
    """Whether an error body has the protocol's shape."""
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    if protocol == "anthropic":
        err = doc.get("error") if isinstance(doc, dict) else None
        return (
            doc.get("type") == "error"
            and isinstance(err, dict)
            and isinstance(err.get("type"), str)
            and isinstance(err.get("message"), str)
        )
    err = doc.get("error") if isinstance(doc, dict) else None
    return isinstance(err, dict) and isinstance(err.get("message"), str) and "type" in err


class Records:
    """The record writer's place: every record the gateway finishes."""

    def __init__(self) -> None:
        self.records: list = []

    def submit(self, record) -> None:
        self.records.append(record)


@dataclass
class Tally:
    cases: int = 0
    records: Records | None = None
    statuses: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def fail(self, why: str) -> None:
        if len(self.failures) < 20:
            self.failures.append(why)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@contextlib.contextmanager
def gateway():
    """A keyless gateway in front of the simulated upstream, both on loopback ports."""
    from prefixgate.config import parse_config
    from prefixgate.lab.upstream_sim.app import create_upstream_app
    from prefixgate.lab.upstream_sim.settings import SimSettings
    from prefixgate.serve.app import create_app
    from prefixgate.serve.process import ServerThread

    with ServerThread(create_upstream_app(SimSettings())) as sim:
        config = parse_config(
            {
                "channels": [{"name": "sim", "base_url": sim.url + "/v1"}],
                "store": None,
                # valgrind or a loaded machine: never shed a fuzz case as overloaded
                "server": {"shed_loop_lag": None},
            }
        )
        records = Records()
        app = create_app(config, recorder=records)
        with ServerThread(app) as gw:
            yield gw.url, records, app.state.gateway


def settled(gw, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while gw.open_records and time.monotonic() < deadline:
        time.sleep(0.01)


ROUND = 1250  # cases per route and round


def progress(tally: Tally) -> None:
    """A line on stderr with every figure so far (a cut run still says what it saw)."""
    recs = tally.records.records if tally.records is not None else []
    line = {
        "cases": tally.cases,
        "statuses": dict(sorted(tally.statuses.items())),
        "records": len(recs),
        "records_without_status": sum(1 for r in recs if not r.status),
        "rss_mb": round(rss_mb(), 1),
        "failures": len(tally.failures),
    }
    print("[fuzz] " + json.dumps(line), file=sys.stderr, flush=True)


def _fuzz_route(client, route, protocol, n, seed, tally) -> None:
    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        derandomize=seed is not None,
        suppress_health_check=list(HealthCheck),
    )
    @given(bodies(route))
    def case(body: bytes) -> None:
        r = client.post(route, content=body, headers={"content-type": "application/json"})
        tally.cases += 1
        tally.statuses[r.status_code] += 1
        if tally.cases % 5000 == 0:
            progress(tally)
        if r.status_code >= 500:
            tally.fail(f"{route} {r.status_code} {r.text[:200]} for {body[:120]!r}")
        elif r.status_code >= 400 and not shape_ok(protocol, r.content):
            tally.fail(f"{route} {r.status_code} not {protocol}'s shape: {r.text[:200]}")

    case()


def run(cases: int, seed: int | None = None, rss_bound_mb: float = 256.0) -> dict:
    """Fuzz ``cases`` bodies, spread evenly over the routes; the figures of the run."""
    per_route = max(1, cases // len(ROUTES))
    tally = Tally()
    t0 = time.perf_counter()
    with gateway() as (url, records, gw), httpx.Client(base_url=url, timeout=60) as client:
        rss0 = rss_mb()
        tally.records = records
        # in rounds, so that a run cut short has fuzzed every route alike
        done = 0
        while done < per_route:
            n = min(ROUND, per_route - done)
            for route, protocol in ROUTES.items():
                _fuzz_route(client, route, protocol, n, seed, tally)
            done += n
        settled(gw)
        up = client.get("/healthz").status_code == 200
        rss1 = rss_mb()
    seconds = time.perf_counter() - t0
    unrecorded = tally.cases - len(records.records)
    without_status = sum(1 for r in records.records if not r.status)
    if unrecorded:
        tally.fail(f"{unrecorded} requests without a record")
    if without_status:
        tally.fail(f"{without_status} records without a status")
    if not up:
        tally.fail("the gateway no longer answers /healthz")
    if rss1 - rss0 > rss_bound_mb:
        tally.fail(f"resident memory grew by {rss1 - rss0:.0f} MB")
    return {
        "cases": tally.cases,
        "statuses": dict(sorted(tally.statuses.items())),
        "records": len(records.records),
        "records_without_status": without_status,
        "healthz_after": up,
        "rss_start_mb": round(rss0, 1),
        "rss_end_mb": round(rss1, 1),
        "seconds": round(seconds, 1),
        "failures": tally.failures,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=None, help="derandomize (a fixed draw)")
    ap.add_argument("--rss-bound-mb", type=float, default=256.0)
    args = ap.parse_args()
    out = run(args.cases, args.seed, args.rss_bound_mb)
    print(json.dumps(out, indent=2))
    return 1 if out["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
