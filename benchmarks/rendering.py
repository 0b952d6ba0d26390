"""Hit rates before and after, per chat template: the figures of docs/rendering.md.

Each row plays one agent session (``prefixgate.lab.traffic.template_sessions``) through the
real gateway over an engine serving one of the project's own chat templates, and reads
back the usage, the miss ledger and the doctor's findings from the gateway's store:

- Claude Code's ``<total_tokens>`` reminder (4 turns): a template that keeps system
  messages in place, the DeepSeek-like template that gathers them at the head (the
  gateway's defaults, and ``system_in_place: false``), with and without KV events;
- a thinking tool loop (3 tool results of ~2.5k tokens) then a new user turn: the
  Qwen3-like template (reasoning rendered only after the last user query), a template
  that always renders it, and the Qwen3-like one with ``history_thinking: drop``.

The engine is the simulated vLLM (block 32, unlimited KV cache) unless ``--vllm NAME=URL``
names a real one serving that template (``NAME`` one of hoisting, in_place,
reasoning_last_query; ``URL`` its ``/v1`` base; started with
``--chat-template src/prefixgate/data/templates/NAME.jinja`` and
``--enable-prompt-tokens-details``; its model mapped from the sessions' name to
``--served-model``); ``--only TEXT`` runs the rows whose case holds TEXT.

With ``--claude``, the rows of the real Claude Code CLI (pinned, reminder on, four turns)
on the in-place and hoisting templates, defaults and ``system_in_place: false``.

With ``--sglang``, the rows of the real SGLang 0.5.23 of the tests (``tests/real/``: installed
into their cache folder if it is not yet, and started here serving their agent model with
the hoisting template, page size 32, KV events on): the reminder session and the real Claude
Code CLI, the gateway's defaults and ``system_in_place: false``, the ledger from the cache
model and from SGLang's KV events. Its radix cache is flushed before each row.

    python benchmarks/rendering.py [--vllm hoisting=http://127.0.0.1:8000/v1 ...] [--json]
    python benchmarks/rendering.py --claude [--vllm hoisting=URL --vllm in_place=URL]
    python benchmarks/rendering.py --sglang
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import httpx

from prefixgate.doctor import diagnose
from prefixgate.lab.traffic.template_sessions import (
    reminder_session,
    thinking_loop_session,
    through_gateway,
)

MODEL = "claude-haiku-4-5"
_FOUND = ("template", "kv", "cache_cleared")  # the doctor's findings a row shows


def _causes(ledgers) -> str:
    """The causes of the misses of the measured requests, largest first."""
    total: dict[str, int] = {}
    for x in ledgers:
        for cause, n in x.parts().items():
            if cause not in ("hit", "partial_block") and n:
                total[cause] = total.get(cause, 0) + n
    cleared = sum(x.cleared for x in ledgers)  # of evicted: lost to a cache clear (a flush)
    return ", ".join(
        f"{c} {n:,}" + (f" (cleared {cleared:,})" if c == "evicted" and cleared else "")
        for c, n in sorted(total.items(), key=lambda kv: -kv[1])
    )


def _row(case: str, engine: str, hit: float, prompt: int, ledgers, found) -> dict:
    return {
        "case": case,
        "engine": engine,
        "hit": round(100 * hit, 1),
        "prompt": prompt,
        "ledger": _causes(ledgers) or "-",
        "source": ledgers[-1].source if ledgers and ledgers[-1] else "-",
        "doctor": ", ".join(found) or "-",
    }


def _played_row(case: str, engine: str, played, start: int, end) -> dict:
    found = [
        f.kind
        for f in played.diagnosis.findings
        if f.kind.startswith(("template", "kv", "cache_cleared"))
    ]
    new = played.usage[start:end]
    prompt = sum(p for p, _ in new)
    return _row(case, engine, played.hit_rate(start, end), prompt, played.ledgers[start:end], found)


def _tests_on_path() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def claude_run(case: str, engine: str, where: dict, flush=None) -> dict:
    """One row: the real Claude Code CLI (pinned, ``tests/real/harness.py``) with its
    reminder on, four turns (``-p``, then ``--continue``), through a gateway stack
    (``tests/real/agents.stack(**where)``), once the gateway has learned the engine's
    template; ``flush()`` first empties the engine's cache."""
    _tests_on_path()
    from tests.real import harness
    from tests.real.agents import Claude, stack
    from tests.real.reminder import AGENT_ENV, four_turns, later_turns_hit, model_calls

    exe = harness.ensure_claude_code(print)
    if flush is not None:
        flush()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with stack(folder, **where) as s:
            if "vllm_url" in where:
                s.until_learned()
            four_turns(Claude(exe, s, folder, **AGENT_ENV))
            s.wait_stored()
        recs = model_calls(s)
        ledgers = s.ledgers(recs)
        found = [f.kind for f in diagnose(s.dsn).findings if f.kind.startswith(_FOUND)]
    prompt = sum(r.prompt_tokens for r in recs[1:])
    return _row(
        f"Claude Code {harness.CLAUDE_CODE_VERSION}, reminder on, {case}",
        engine,
        later_turns_hit(recs),
        prompt,
        ledgers[1:],
        found,
    )


def claude_rows(real: dict[str, str], served: str) -> list[dict]:
    """The real Claude Code CLI through the gateway over the simulated vLLM serving each
    template, or the real vLLM of ``real`` serving it."""
    rows = []
    cases = [("in_place", {}), ("hoisting", {}), ("hoisting", {"system_in_place": False})]
    for template, channel in cases:
        url = real.get(template)
        where = (
            {"vllm_url": url.removesuffix("/v1"), "model": served}
            if url
            else {"chat_template": template}
        )
        setting = "system_in_place: false" if channel else "defaults"
        engine = "vLLM" if url else "simulated vLLM"
        rows.append(
            claude_run(f"{template} template, {setting}", engine, {**where, "channel": channel})
        )
    return rows


def sglang_rows(claude: bool, only: str) -> list[dict]:
    """The real SGLang of the tests serving the hoisting template: the reminder session
    (defaults, ``system_in_place: false``; the ledger from the cache model, then from
    SGLang's KV events) and, with ``claude``, the real Claude Code CLI the same ways."""
    _tests_on_path()
    from tests.real import harness, harness_sglang
    from tests.real.agents import engine_settings

    engine = f"SGLang {harness_sglang.SGLANG_VERSION}"
    python = harness_sglang.ensure_sglang(print)
    model = harness.ensure_agent_model(harness.ensure_vllm(print), print)
    log = harness.cache_dir() / "logs" / "bench-sglang-hoisting.log"
    server, events = harness_sglang.hoisting_server(python, model, log=log)

    def flush() -> None:
        httpx.post(server.url + "/flush_cache", timeout=60).raise_for_status()

    cases = []  # the label, the stack's settings
    for kv in (False, True):
        for setting in ({}, {"system_in_place": False}):
            label = "system_in_place: false" if setting else "defaults"
            label += ", ledger from the KV events" if kv else ""
            cases.append((label, engine_settings(server, events if kv else None, **setting)))
    rows = []
    server.start(print, timeout=1200)  # a loaded machine starts it slowly
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for label, where in cases:
                case = f"reminder, hoisting template, {label}"
                if only not in case:
                    continue
                flush()
                # a session of its own per row: the flush removes the earlier rows' blocks,
                # and SGLang's events report that as a clear (the ledger's `cleared`)
                played = through_gateway(
                    reminder_session(MODEL, seed=len(rows) + 1),
                    Path(tmp) / str(len(rows)),
                    template="hoisting",
                    base_url=server.base_url,
                    model_map={MODEL: server.served_model},
                    **where["channel"],
                )
                rows.append(_played_row(case, engine, played, 1, None))
        for label, where in cases if claude else ():
            rows.append(claude_run(f"hoisting template, {label}", engine, where, flush))
    finally:
        server.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", action="append", default=[], help="NAME=URL of a real vLLM")
    ap.add_argument("--served-model", default="tiny", help="the real vLLMs' model name")
    ap.add_argument("--only", default="", help="run only the rows whose case holds this")
    ap.add_argument("--claude", action="store_true", help="the real Claude Code CLI's rows instead")
    ap.add_argument("--sglang", action="store_true", help="the real SGLang's rows instead")
    ap.add_argument("--json", action="store_true", help="rows as JSON lines")
    args = ap.parse_args(argv)
    real = dict(v.split("=", 1) for v in args.vllm)
    if args.sglang:
        return _print(sglang_rows(args.claude, args.only), args.json)
    if args.claude:
        return _print(claude_rows(real, args.served_model), args.json)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)

        def run(label: str, session, template: str, start: int, end, **kw):
            url = real.get(template)
            if (url is not None and kw.get("events")) or args.only not in label:
                return  # the simulated engine's events only
            if url is not None:
                kw["model_map"] = {MODEL: args.served_model}
            played = through_gateway(
                session, folder / str(len(rows)), template=template, base_url=url, **kw
            )
            engine = "vLLM" if url else "simulated vLLM"
            rows.append(_played_row(label, engine, played, start, end))

        for events in (False, True):
            ev = " (KV events)" if events else ""
            run(f"reminder, in-place template{ev}", reminder_session(MODEL), "in_place", 1,
                None, events=events)  # fmt: skip
            run(f"reminder, hoisting template, defaults{ev}", reminder_session(MODEL),
                "hoisting", 1, None, events=events)  # fmt: skip
            run(f"reminder, hoisting template, system_in_place: false{ev}",
                reminder_session(MODEL), "hoisting", 1, None, events=events,
                system_in_place=False)  # fmt: skip
        for events in (False, True):
            ev = " (KV events)" if events else ""
            run(f"new user turn after a thinking loop, Qwen3-like template{ev}",
                thinking_loop_session(MODEL), "reasoning_last_query", -1, None,
                events=events)  # fmt: skip
        run("new user turn after a thinking loop, reasoning always rendered",
            thinking_loop_session(MODEL), "in_place", -1, None)  # fmt: skip
        run("new user turn after a thinking loop, Qwen3-like, history_thinking: drop",
            thinking_loop_session(MODEL), "reasoning_last_query", -1, None,
            history_thinking="drop")  # fmt: skip
        kept = through_gateway(thinking_loop_session(MODEL), folder / "k", template="in_place")
        dropped = through_gateway(
            thinking_loop_session(MODEL), folder / "d", template="in_place", history_thinking="drop"
        )  # the sizes on the simulated engine
    _print(rows, args.json)
    if args.json:
        return 0
    k, d = kept.usage[-1][0], dropped.usage[-1][0]
    print(
        f"\nreasoning kept in the history: the new user turn's prompt is {k:,} tokens; "
        f"dropped: {d:,} ({k - d:,} tokens of past reasoning the model no longer sees)"
    )
    return 0


def _print(rows: list[dict], as_json: bool) -> int:
    if as_json:
        for r in rows:
            print(json.dumps(r))
        return 0
    print("| case | engine | hit (turns measured) | their prompt tokens | the ledger says | "
          "ledger source | doctor |")  # fmt: skip
    print("| --- | --- | ---: | ---: | --- | --- | --- |")
    for r in rows:
        print(f"| {r['case']} | {r['engine']} | {r['hit']}% | {r['prompt']:,} | {r['ledger']} | "
              f"{r['source']} | {r['doctor']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
