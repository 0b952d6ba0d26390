"""Agent clients end to end: each real CLI, two turns through the gateway, and the share of
its second turn's prompt that the engine served from its prefix cache.

    python benchmarks/clients.py [--upstream real|sglang|sim|both|all] [--clients claude,codex,opencode] [--json]

The clients are the pinned npm packages of ``tests/real/harness.py`` (Claude Code, the Codex
CLI, opencode), installed once into its cache folder, driven as ``tests/real/agents.py``
drives them: offline, a throw-away HOME, a first turn ("say hi") and a second that
continues the session ("and once more"). ``real`` is the vLLM CPU build serving the agent
model (the tiny random-weight model with a 64k window and answers that end by themselves),
``sglang`` the real SGLang 0.5.23 (``tests/real/harness_sglang.py``) serving the same model
(page size 32, ``--enable-cache-report``), ``sim`` the simulated vLLM (exact tokens, block size 32 as well). The hit rate is turn 2's
``cached_tokens / prompt_tokens`` as the engine reported them to the gateway (its record):
turn 1's prompt (and, on the real engine, the blocks its answer filled) hit, the rest is
turn 2's own (the answer as re-rendered, the new question).
Progress on stderr; the table (or ``--json``) on stdout. Figures: ``docs/clients.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.real import harness, harness_sglang  # noqa: E402
from tests.real.agents import Claude, Codex, Opencode, converse  # noqa: E402

CLIENTS = {
    "claude": (
        "Claude Code",
        "@anthropic-ai/claude-code",
        harness.CLAUDE_CODE_VERSION,
        harness.ensure_claude_code,
        lambda exe, tmp: lambda s: Claude(exe, s, tmp, **_CLAUDE_ENV),
        "/v1/messages",
    ),
    "codex": (
        "Codex CLI",
        "@openai/codex",
        harness.CODEX_VERSION,
        harness.ensure_codex,
        lambda exe, tmp: lambda s: Codex(exe, s, tmp),
        "/v1/responses",
    ),
    "opencode": (
        "opencode",
        "opencode-ai",
        harness.OPENCODE_VERSION,
        harness.ensure_opencode,
        lambda exe, tmp: lambda s: Opencode(exe, s, tmp),
        "/v1/chat/completions",
    ),
}
_CLAUDE_ENV = {
    "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(harness.AGENT_MAX_MODEL_LEN),
    "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256",
}


def say(msg: str) -> None:
    print(f"[clients {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def measure(key: str, upstream: str, server, engine: str = "vLLM") -> dict:
    name, package, version, ensure, make, endpoint = CLIENTS[key]
    exe = ensure(say)
    say(f"{name} {version}: two turns through the gateway on the {upstream} {engine} …")
    with tempfile.TemporaryDirectory(prefix=f"clients-{key}-") as tmp:
        t0 = time.monotonic()
        turns = converse(make(exe, Path(tmp)), Path(tmp), server)
        took = time.monotonic() - t0
    one, two = turns.records
    row = {
        "client": name,
        "package": package,
        "version": version,
        "endpoint": endpoint,
        "upstream": upstream,
        "engine": engine,
        "turn1_prompt_tokens": one.prompt_tokens,
        "turn2_prompt_tokens": two.prompt_tokens,
        "turn2_cached_tokens": two.cached_tokens or 0,
        "turn2_hit_rate": turns.hit_rate,
        "seconds": took,
    }
    say(f"{name}: turn 2 hit {row['turn2_hit_rate']:.1%} of {two.prompt_tokens} tokens")
    return row


@contextlib.contextmanager
def real_engine(engine: str):
    """The real vLLM or SGLang serving the agent model, started now, stopped after."""
    python = harness.ensure_vllm(say)
    model = harness.ensure_agent_model(python, say)
    log = harness.cache_dir() / "logs" / f"clients-{engine}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    kind = harness.VllmServer
    if engine == "sglang":
        python, kind = harness_sglang.ensure_sglang(say), harness_sglang.SglangServer
    server = kind(python, model, log=log, max_model_len=harness.AGENT_MAX_MODEL_LEN).start(say)
    try:
        yield server
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", choices=("real", "sglang", "sim", "both", "all"), default="both")
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    keys = [k.strip() for k in args.clients.split(",") if k.strip()]
    unknown = set(keys) - set(CLIENTS)
    if unknown:
        ap.error(f"unknown clients: {', '.join(sorted(unknown))} (known: {', '.join(CLIENTS)})")
    rows = []
    if args.upstream in ("sim", "both", "all"):
        rows += [measure(k, "simulated", None) for k in keys]
    if args.upstream in ("real", "both", "all"):
        with real_engine("vllm") as server:
            rows += [measure(k, "real", server) for k in keys]
    if args.upstream in ("sglang", "all"):
        with real_engine("sglang") as server:
            rows += [measure(k, "real", server, "SGLang") for k in keys]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        "| client | version | endpoint | upstream | turn 1 prompt | turn 2 prompt | cached | hit |"
    )
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['client']} | {r['version']} | `{r['endpoint']}` | {r['upstream']} {r['engine']} | "
            f"{r['turn1_prompt_tokens']:,} | {r['turn2_prompt_tokens']:,} | "
            f"{r['turn2_cached_tokens']:,} | {r['turn2_hit_rate']:.1%} |"
        )


if __name__ == "__main__":
    main()
