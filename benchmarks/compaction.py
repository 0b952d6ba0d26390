"""Compaction through the gateway: the real Claude Code and Codex CLIs until they compact,
against the real vLLM CPU build serving the agent model with a 32k window, and the
figures of ``docs/diagnostics.md`` (its section on compaction).

    python benchmarks/compaction.py [--json]

The sessions are those of ``tests/real/compactions.py`` (and ``tests/real/test_compaction.py``):
Claude Code overflows the window on its second turn of notes (the gateway answers
``prompt is too long``, the CLI compacts and retries) and goes on for a third; Codex runs
three turns with an auto-compaction limit just above its first prompt, once with a provider
it takes for Azure's (the gateway's Responses compaction) and once with any other (its own
summary turn). For each: every conversation request as the gateway recorded it (kind,
prompt tokens, the engine's cached tokens, the class of change recorded), the prompt
before and after the compaction, and the hit rate of the turns after it.
Progress on stderr; the table (or ``--json``) on stdout.
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

from tests.real import harness  # noqa: E402
from tests.real.compactions import (  # noqa: E402
    claude_overflows,
    codex_compacts,
    hit_rate,
    holds,
)

from prefixgate.engine.errors import parse_context_error  # noqa: E402


def say(msg: str) -> None:
    print(f"[compaction] {msg}", file=sys.stderr, flush=True)


def _kind(rec) -> str:
    if rec.status != 200:
        return f"refused ({rec.status})"
    if holds(rec, ":compaction_trigger"):
        return "compaction (gateway)"
    last = rec.segments_in[-1] if rec.segments_in else None
    text = (rec.texts or {}).get(last.hash, "") if last is not None else ""
    if "CONTEXT CHECKPOINT COMPACTION" in text or "summary" in text.lower()[-2000:]:
        return "compaction (client)"
    return "turn"


def figures(name: str, session) -> dict:
    rows = [
        {
            "kind": _kind(r),
            "prompt_tokens": r.prompt_tokens,
            "cached_tokens": r.cached_tokens,
            "change": r.change.cls if r.change is not None else None,
        }
        for r in session.records
    ]
    asks = [i for i, row in enumerate(rows) if row["kind"].startswith(("compaction", "refused"))]
    first = asks[0] if asks else len(rows)
    before = [r.prompt_tokens for r in session.records[:first] if r.status == 200]
    after = [
        r
        for r, row in zip(session.records[first:], rows[first:], strict=True)
        if row["kind"] == "turn"
    ]
    refused = [
        o.prompt
        for c in session.chats
        if c["status"] == 400 and (o := parse_context_error(c["error"] or ""))
    ]
    return {
        "session": name,
        "requests": rows,
        "refused_prompts": refused,  # what the engine refused, by its own count
        "prompt_before": max(before) if before else None,
        "prompt_after": after[0].prompt_tokens if after else None,
        "turns_after": len(after),
        "hit_rate_after": round(hit_rate(after), 4) if after else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    python = harness.ensure_vllm(say)
    model = harness.ensure_agent_model(python, say)
    claude, codex = harness.ensure_claude_code(say), harness.ensure_codex(say)
    log = harness.cache_dir() / "logs" / f"bench-compaction-{time.strftime('%Y%m%d-%H%M%S')}.log"
    server = harness.VllmServer(python, model, log=log, max_model_len=harness.SMALL_WINDOW)
    out = []
    with contextlib.ExitStack() as stack:
        server.start(say)
        stack.callback(server.stop)
        runs = (
            ("Claude Code", lambda tmp: claude_overflows(claude, server, tmp)),
            ("Codex (azure)", lambda tmp: codex_compacts(codex, server, tmp, name="azure")),
            ("Codex (own)", lambda tmp: codex_compacts(codex, server, tmp, name="prefixgate")),
        )
        for name, run in runs:
            say(f"{name} …")
            with tempfile.TemporaryDirectory() as tmp:
                out.append(figures(name, run(Path(tmp))))
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for f in out:
        refused = f", refused {f['refused_prompts']}" if f["refused_prompts"] else ""
        print(
            f"\n{f['session']}: prompt before {f['prompt_before']}{refused}, after {f['prompt_after']},"
        )
        print(f"  {f['turns_after']} turn(s) after, hit rate {f['hit_rate_after']:.1%}")
        print(f"  {'request':<22} {'prompt':>7} {'cached':>7}  change")
        for row in f["requests"]:
            cached = "-" if row["cached_tokens"] is None else row["cached_tokens"]
            print(
                f"  {row['kind']:<22} {row['prompt_tokens'] or 0:>7} {cached:>7}"
                f"  {row['change'] or ''}"
            )


if __name__ == "__main__":
    main()
