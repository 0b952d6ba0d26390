"""A/B: two builds or settings of the gateway, measured in turns in one run.

    python benchmarks/overhead_ab.py --ref HEAD~1                      # this tree vs a git ref
    python benchmarks/overhead_ab.py --set-b server.busy_poll_us=0     # one setting changed
    python benchmarks/overhead_ab.py --ref main --store --cases messages/stream,chat/json/32

On a shared machine, figures at c1 move by tenths of a millisecond between runs, more than
most changes do. So A and B run side by side against one fake upstream
(``overhead_upstream.py``): each round measures the direct path, then A and B (their order
alternating), each for ``--seconds``; "added" is a gateway's figure minus the direct path's
of the same round, and the table gives the medians over the rounds. The placement is
``overhead.py``'s: both gateways on core 0 (one at a time under load), the upstream and
the load generator on core 1.

A is the working tree; B is ``--ref`` (checked out into a temporary git worktree and run
with its ``src`` first on ``PYTHONPATH``), or the working tree again. ``--set-a`` /
``--set-b`` change a config value of one side (a dotted path, a JSON value), for A/B of a
setting on the same code. ``--store`` runs both with the SQLite store and segment capture.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as ov  # noqa: E402
import overhead_load as load  # noqa: E402

DEFAULT_CASES = "chat/json,messages/json,messages/stream"


def parse_case(text: str) -> tuple[str, bool, int, str]:
    """``endpoint/kind[/concurrency]``, e.g. ``messages/stream`` or ``chat/json/32``."""
    parts = text.strip().split("/")
    if len(parts) not in (2, 3) or parts[0] not in ("chat", "messages"):
        raise argparse.ArgumentTypeError(f"bad case {text!r}: endpoint/json|stream[/conc]")
    if parts[1] not in ("json", "stream"):
        raise argparse.ArgumentTypeError(f"bad case {text!r}: the kind is json or stream")
    conc = int(parts[2]) if len(parts) == 3 else 1
    return parts[0], parts[1] == "stream", conc, "fake"


def apply_set(config: dict, assignment: str, upstream: str = "") -> None:
    """``a.b.c=<json>`` into ``config`` (a value that is not JSON is taken as a string; a
    number in the path indexes a list; ``{upstream}`` in the value is the fake upstream's
    URL, e.g. ``channels.0.replicas=["{upstream}/v1"]``)."""
    path, sep, value = assignment.partition("=")
    if not sep or not path:
        raise SystemExit(f"--set wants path=value, not {assignment!r}")
    value = value.replace("{upstream}", upstream)
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = value
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    node = config
    for key in keys[:-1]:
        node = node[key] if isinstance(key, int) else node.setdefault(key, {})
    node[keys[-1]] = parsed


class Side:
    """One gateway of the comparison: its code, its settings, its process."""

    def __init__(self, name: str, src: Path | None, sets: list[str], work: Path, store: bool):
        self.name, self.src, self.sets, self.work, self.store = name, src, sets, work, store
        self.port = ov.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, upstream: str) -> None:
        store = self.work if self.store else None
        config = ov.gateway_config(self.port, upstream, store, self.name)
        for assignment in self.sets:
            apply_set(config, assignment, upstream)
        path = self.work / f"{self.name}.json"
        path.write_text(json.dumps(config))
        env = dict(os.environ)
        if self.src is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                [str(self.src), *filter(None, [env.get("PYTHONPATH")])]
            )
        if self.src is not None:  # the ref's package, not the working tree's
            where = subprocess.run(
                [sys.executable, "-c", "import prefixgate; print(prefixgate.__file__)"],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            if not Path(where).resolve().is_relative_to(self.src.resolve()):
                raise SystemExit(f"{self.name} would import prefixgate from {where}")
        self.log = open(self.work / f"{self.name}.log", "ab")  # noqa: SIM115
        cmd = [sys.executable, "-m", "prefixgate.cli", "serve", "--config", str(path)]
        self.proc = subprocess.Popen(
            [*cmd, "--log-level", "warning"],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            preexec_fn=ov.pinned(ov.GATEWAY_CPU),
        )
        ov.wait_http(self.url + "/healthz", self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            ov.stop(self.proc)
            self.log.close()


async def measure(url: str, target: str, case, anth: dict, chat: dict, seconds: float) -> dict:
    u, body, headers = ov.request_of(target, url, case, anth, chat)
    res = await load.run(u, body, headers, concurrency=case[2], seconds=seconds)
    p50, p99, ttft = ov.latency_ms(res)
    if p50 is None:
        raise SystemExit(f"{target} answered no request in {ov.case_name(case)}")
    return {
        "p50": p50,
        "p99": p99,
        "ttft": ttft,
        "rps": res.rps,
        "errors": res.errors,
    }


def run(args) -> dict:
    anth, chat = ov.bodies()
    work = Path(tempfile.mkdtemp(prefix="prefixgate-ab-"))
    tree = None
    if args.ref:
        tree = work / "ref"
        subprocess.run(
            ["git", "-C", str(ov.ROOT), "worktree", "add", "--detach", "-q", str(tree), args.ref],
            check=True,
        )
    os.sched_setaffinity(0, {ov.LOAD_CPU})
    up_port = ov.free_port()
    upstream = subprocess.Popen(
        [sys.executable, str(ov.HERE / "overhead_upstream.py"), "--port", str(up_port)],
        preexec_fn=ov.pinned(ov.LOAD_CPU),
    )
    up_url = f"http://127.0.0.1:{up_port}"
    sides = [
        Side("A", None, args.set_a, work, args.store),
        Side("B", tree / "src" if tree else None, args.set_b, work, args.store),
    ]
    added: dict[tuple[str, str], list[dict]] = {}
    try:
        ov.wait_http(up_url + "/health", upstream)
        for side in sides:
            side.start(up_url)
            for case in args.cases:  # warm-up: imports, pools, first-call paths
                ov._arun(measure(side.url, "gateway", case, anth, chat, 0.3))
        for r in range(args.rounds):
            for case in args.cases:
                direct = ov._arun(measure(up_url, "direct", case, anth, chat, args.seconds))
                for side in sides if r % 2 == 0 else sides[::-1]:
                    got = ov._arun(measure(side.url, "gateway", case, anth, chat, args.seconds))
                    row = {
                        "p50": got["p50"] - direct["p50"],
                        "p99": got["p99"] - direct["p99"],
                        "ttft": got["ttft"] - direct["ttft"] if case[1] else None,
                        "rps": got["rps"],
                        "errors": got["errors"],
                    }
                    added.setdefault((ov.case_name(case), side.name), []).append(row)
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    finally:
        for side in sides:
            side.stop()
        ov.stop(upstream)
        if tree is not None:
            subprocess.run(
                ["git", "-C", str(ov.ROOT), "worktree", "remove", "--force", str(tree)],
                check=False,
            )
    return summarize(added, args)


def summarize(added: dict, args) -> dict:
    def med(rows: list[dict], key: str):
        values = [r[key] for r in rows if r[key] is not None]
        return statistics.median(values) if values else None

    cases = {}
    for case in args.cases:
        label = ov.case_name(case)
        cases[label] = {
            side: {
                "added_p50_ms": med(added[(label, side)], "p50"),
                "added_p99_ms": med(added[(label, side)], "p99"),
                "added_ttft_ms": med(added[(label, side)], "ttft"),
                "rps": med(added[(label, side)], "rps"),
                "errors": sum(r["errors"] for r in added[(label, side)]),
            }
            for side in ("A", "B")
        }
    return {
        "a": {"tree": "working tree", "set": args.set_a},
        "b": {"tree": args.ref or "working tree", "set": args.set_b},
        "store": args.store,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "cases": cases,
    }


def table(summary: dict) -> str:
    def f(v, fmt="{:.3f}") -> str:
        return "-" if v is None else fmt.format(v)

    a, b = summary["a"], summary["b"]
    lines = [
        f"A: {a['tree']} {' '.join(a['set'])}".rstrip(),
        f"B: {b['tree']} {' '.join(b['set'])}".rstrip(),
        f"{summary['rounds']} rounds, store {'on' if summary['store'] else 'off'}; "
        "added = gateway minus direct in the same round, medians, ms",
        "",
        f"{'case':<20}{'A +p50':>9}{'B +p50':>9}{'B/A':>7}{'A +ttft':>9}{'B +ttft':>9}"
        f"{'A +p99':>9}{'B +p99':>9}{'A rps':>8}{'B rps':>8}",
    ]
    for label, row in summary["cases"].items():
        ra, rb = row["A"], row["B"]
        ratio = (
            rb["added_p50_ms"] / ra["added_p50_ms"]
            if ra["added_p50_ms"] and rb["added_p50_ms"] is not None and ra["added_p50_ms"] > 0
            else None
        )
        lines.append(
            f"{label:<20}{f(ra['added_p50_ms']):>9}{f(rb['added_p50_ms']):>9}"
            f"{f(ratio, '{:.2f}'):>7}{f(ra['added_ttft_ms']):>9}{f(rb['added_ttft_ms']):>9}"
            f"{f(ra['added_p99_ms'], '{:.2f}'):>9}{f(rb['added_p99_ms'], '{:.2f}'):>9}"
            f"{f(ra['rps'], '{:.0f}'):>8}{f(rb['rps'], '{:.0f}'):>8}"
        )
        errors = ra["errors"] + rb["errors"]
        if errors:
            lines.append(f"  {errors} failed requests in {label}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", help="B runs this git ref (default: the working tree, as A)")
    ap.add_argument("--set-a", action="append", default=[], metavar="PATH=JSON")
    ap.add_argument("--set-b", action="append", default=[], metavar="PATH=JSON")
    ap.add_argument("--store", action="store_true", help="both with the SQLite store")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=1.2, help="measured seconds per turn")
    ap.add_argument(
        "--cases",
        type=lambda s: [parse_case(c) for c in s.split(",") if c.strip()],
        default=[parse_case(c) for c in DEFAULT_CASES.split(",")],
        help=f"endpoint/json|stream[/concurrency], comma-separated (default {DEFAULT_CASES})",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not args.ref and not args.set_a and not args.set_b:
        print("A and B are the same (no --ref, --set-a or --set-b): an A/A run", file=sys.stderr)
    summary = run(args)
    print(json.dumps(summary, indent=2) if args.json else table(summary))


if __name__ == "__main__":
    main()
