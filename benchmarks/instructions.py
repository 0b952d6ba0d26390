"""Instructions the gateway executes per request, counted by valgrind (callgrind).

    python benchmarks/instructions.py [-n 100] [--ref GIT_REF] [--only NAME] [--keep DIR] [--json]

On a shared, noisy machine, times move by tens of percent from one run to the next;
instruction counts do not (two runs agree to 0.1 %). So this is how to tell whether a
change to the hot path made it cheaper. Each case starts the gateway (``prefixgate
serve``, one worker, with or without the SQLite store and segment capture) under
``valgrind --tool=callgrind`` with counting off, warms it up with 30 requests, counts the
user-space instructions of the next ``-n`` requests (sent one at a time, from outside
valgrind) and divides. The fake upstream and the bodies are those of
``benchmarks/overhead.py``. ``--ref`` also counts the gateway as it was at a git ref
(checked out into a temporary worktree) and prints the ratio. Needs ``valgrind`` on the
PATH (Debian: ``apt-get install valgrind``).

Counts weigh every instruction alike: a ``rep movsb`` copy counts a byte an instruction,
so copies weigh more here than in time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead as ov  # noqa: E402
import overhead_ab as ab  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CASES = [  # (endpoint, stream, store)
    ("chat", False, False),
    ("chat", True, False),
    ("messages", False, False),
    ("messages", True, False),
    ("chat", False, True),
    ("messages", False, True),
    ("messages", True, True),
]


def count(
    case: tuple[str, bool, bool],
    n: int,
    src: Path | None,
    anth,
    chat,
    keep: Path | None = None,
    sets: tuple[str, ...] = (),
    model: str = "fake",
) -> float:
    """Instructions per request of one case (``src``: the package sources to run)."""
    endpoint, stream, store = case
    work = Path(tempfile.mkdtemp(prefix="prefixgate-instr-"))
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    up_port, port = ov.free_port(), ov.free_port()
    upstream = subprocess.Popen(
        [sys.executable, str(HERE / "overhead_upstream.py"), "--port", str(up_port)]
    )
    config = ov.gateway_config(port, f"http://127.0.0.1:{up_port}", work if store else None)
    if ((src or ROOT / "src") / "prefixgate" / "busypoll.py").exists():
        # No busy polling: its idle turns would be counted as the request's work.
        config["server"]["busy_poll_us"] = 0
    package = (src or ROOT / "src") / "prefixgate"
    settings = [package / "config.py", *sorted((package / "config").glob("*.py"))]
    if any(p.exists() and "shed_loop_lag" in p.read_text() for p in settings):
        # No load shedding: under valgrind every request makes the loop run late.
        config["server"]["shed_loop_lag"] = None
    for assignment in sets:
        path = assignment.partition("=")[0]
        section = path.split(".", 1)[0]
        if "." in path and section in config and config[section] is None:
            continue  # a case without that section (no store): nothing to set
        ab.apply_set(config, assignment, f"http://127.0.0.1:{up_port}")
    (work / "config.json").write_text(json.dumps(config))
    log = open(work / "valgrind.log", "w")  # noqa: SIM115
    gateway = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={work}/callgrind.out",
            sys.executable,
            "-m",
            "prefixgate.cli",
            "serve",
            "--config",
            str(work / "config.json"),
            "--log-level",
            "warning",
        ],
        stdout=log,
        stderr=log,
        env=env,
    )
    try:
        ov.wait_http(f"http://127.0.0.1:{port}/healthz", gateway, timeout=600)
        url, body, headers = ov.request_of(
            "prefixgate", f"http://127.0.0.1:{port}", (endpoint, stream, 1, model), anth, chat
        )
        headers = {**headers, "content-type": "application/json"}
        with httpx.Client(timeout=120) as client:

            def send(k: int) -> None:
                for _ in range(k):
                    r = client.post(url, content=body, headers=headers)
                    if r.status_code != 200:
                        raise SystemExit(f"{endpoint}: {r.status_code} {r.text[:200]}")

            send(30)
            toggle = ["callgrind_control", "-i"]
            subprocess.run([*toggle, "on", str(gateway.pid)], capture_output=True, check=True)
            send(n)
            subprocess.run([*toggle, "off", str(gateway.pid)], capture_output=True, check=True)
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(120)
        upstream.kill()
        upstream.wait()
        log.close()
    text = (work / "valgrind.log").read_text()
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        tag = f"{endpoint}-{'stream' if stream else 'json'}-{'store' if store else 'nostore'}"
        shutil.copy(
            work / "callgrind.out", keep / f"callgrind.{tag}{'' if src is None else '.ref'}"
        )
    shutil.rmtree(work, ignore_errors=True)
    m = re.search(r"Collected : (\d+)", text)
    if m is None:
        raise SystemExit(f"no count from valgrind:\n{text[-2000:]}")
    return int(m.group(1)) / n


@contextlib.contextmanager
def checked_out(ref: str | None):
    """The tree at git ``ref``, checked out into a temporary worktree removed on the way
    out (None without a ref)."""
    if not ref:
        yield None
        return
    path = Path(tempfile.mkdtemp(prefix="prefixgate-ref-")) / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), ref], check=True
    )
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=100, help="requests counted per case")
    ap.add_argument("--ref", help="also count the gateway at this git ref")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--keep",
        type=Path,
        help="keep each case's callgrind.out in this folder (read with callgrind_annotate)",
    )
    ap.add_argument("--only", help="count only the cases whose name contains this")
    ap.add_argument(
        "--model",
        default="fake",
        help="the model asked for: fake-long streams 256 content chunks instead of 4, so "
        "(fake-long - fake) / 252 is the cost of one relayed chunk",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PATH=JSON",
        help="a config setting for every gateway counted that has its section "
        "(e.g. store.journal_path=null: the cases with a store)",
    )
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    anth, chat = ov.bodies()
    rows = []
    with checked_out(args.ref) as ref_tree:
        for case in CASES:
            name = (
                f"{case[0]}/{'stream' if case[1] else 'json'}/{'store' if case[2] else 'nostore'}"
            )
            if args.only and args.only not in name:
                continue
            print(f"counting {name} …", file=sys.stderr, flush=True)
            sets = tuple(args.set)
            row = {
                "case": name,
                "instructions": count(case, args.n, None, anth, chat, args.keep, sets, args.model),
            }
            if ref_tree is not None:
                row["ref_instructions"] = count(
                    case, args.n, ref_tree / "src", anth, chat, args.keep, sets, args.model
                )
            rows.append(row)
    if args.json:
        print(json.dumps({"n": args.n, "ref": args.ref, "cases": rows}, indent=2))
        return
    head = f"{'case':<26}{'M instr/request':>16}"
    if args.ref:
        head += f"{'at ' + args.ref[:12]:>18}{'ratio':>8}"
    print(head)
    for r in rows:
        line = f"{r['case']:<26}{r['instructions'] / 1e6:>16.3f}"
        if args.ref:
            ratio = r["instructions"] / r["ref_instructions"]
            line += f"{r['ref_instructions'] / 1e6:>18.3f}{ratio:>8.2f}"
        print(line)


if __name__ == "__main__":
    main()
