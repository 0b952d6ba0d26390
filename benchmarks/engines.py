"""The seed's deployment comparison across engines: ``prefixgate bench`` runs one scenario
matrix against the real vLLM and the real SGLang side by side, in one report.

    python benchmarks/engines.py [--out DIR] [--write-doc] [--runs N] [--output-tokens N]

Both engines are the pinned CPU builds of ``tests/real`` (vLLM 0.32 from
``harness.py``, SGLang 0.5.23 from ``harness_sglang.py``), installed once into its cache
folder, serving the same tiny random-weight model (2 layers, hidden 128) with prefix
caching at 32 tokens a block/page, both up while the bench runs (one target after the
other). The scenarios: single-stream decode (excluding TTFT), long prefill cold and warm,
concurrency 4 and 8, agent sessions. ``--write-doc`` puts the report into
``docs/engines.md`` (between its ``bench`` markers). Progress on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.real import harness, harness_sglang  # noqa: E402

SCENARIOS = "decode,prefill,concurrency4,concurrency8,agent"
DOC = ROOT / "docs" / "engines.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def say(msg: str) -> None:
    print(f"[engines {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def engines():
    """The real vLLM and the real SGLang, each serving the tiny model; both stopped after."""
    vllm_python = harness.ensure_vllm(say)
    model = harness.ensure_model(vllm_python, say)
    sglang_python = harness_sglang.ensure_sglang(say)
    logs = harness.cache_dir() / "logs"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    servers = []
    try:
        servers.append(
            harness.VllmServer(vllm_python, model, log=logs / f"engines-vllm-{stamp}.log")
        )
        servers[-1].start(say)
        servers.append(
            harness_sglang.SglangServer(
                sglang_python, model, log=logs / f"engines-sglang-{stamp}.log"
            )
        )
        servers[-1].start(say)
        yield servers
    finally:
        for server in servers:
            server.stop()


def bench_args(servers, out: Path, runs: int, output_tokens: int, prefill_tokens: int):
    """The ``prefixgate bench`` command line for the two servers."""
    vllm, sglang = servers
    return [
        str(Path(sys.executable).with_name("prefixgate")),  # the console script beside it
        "bench",
        "--target",
        f"vllm-0.32={vllm.base_url}",
        "--target",
        f"sglang-0.5.23={sglang.base_url}",
        "--scenarios",
        SCENARIOS,
        "--runs",
        str(runs),
        "--output-tokens",
        str(output_tokens),
        "--prefill-tokens",
        str(prefill_tokens),
        "--no-progress",
        "--out",
        str(out),
    ]


def summary(report: str) -> str:
    """The report's head and its two summary tables (the per-scenario tables stay in the
    output folder), its headings moved under the doc's section."""
    head, *sections = report.split("\n## ")
    kept = [head] + [x for x in sections if x.startswith(("Throughput", "Latency"))]
    text = "\n### ".join(kept).strip()
    return text.replace("# prefixgate bench", "### prefixgate bench", 1)


def write_doc(report: str) -> None:
    text = DOC.read_text()
    block = f"{BEGIN}\n{summary(report)}\n{END}"
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} has no {BEGIN} … {END} block")
    DOC.write_text(
        re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="keep the bench outputs here")
    ap.add_argument("--write-doc", action="store_true", help="rewrite docs/engines.md's report")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--prefill-tokens", type=int, default=6000)
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        out = args.out or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        with engines() as servers:
            cmd = bench_args(servers, out, args.runs, args.output_tokens, args.prefill_tokens)
            say("running prefixgate " + " ".join(cmd[1:]))
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        report = (out / "report.md").read_text()
    print(report)
    if args.write_doc:
        write_doc(report)
        say(f"wrote the report into {DOC}")


if __name__ == "__main__":
    main()
