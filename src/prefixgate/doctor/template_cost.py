"""What the engine's chat template costs: the miss ledgers' ``prefix_changed`` tokens
whose first changed segment is one the template moved or re-rendered
(:mod:`prefixgate.record.rendered`), as two findings with their measured loss:

- **hoisting** (``template_hoisting``): the changed segment is a later system message
  rendered at the head (``messages[i]:system@head``): the template gathers every system
  message into the system prompt, so each new one (Claude Code's ``<total_tokens>``
  reminder, after every user prompt and tool result) changes the prompt's head and the
  whole conversation is recomputed at every turn;
- **reasoning** (``template_reasoning``): the changed segment is an assistant message the
  template stopped rendering with its reasoning (``messages[i]:assistant/no-reasoning``):
  reasoning is rendered only after the last user query, so each new user turn recomputes
  the tool loop before it.

Every sum runs inside the database (portable SQL, :meth:`Store.query`).
"""

from __future__ import annotations

from prefixgate.doctor.findings import CRITICAL, WARNING, Finding, Table
from prefixgate.doctor.output import pct, tokens
from prefixgate.record.rendered import AT_HEAD, NO_REASONING
from prefixgate.store import Store

__all__ = ["MIN_SHARE", "findings"]

MIN_SHARE = 0.02  # of a channel's prompt tokens: a loss worth a finding
CRITICAL_SHARE = 0.20


def findings(store: Store, where: str, params: list, prompt_tokens: dict[str, int]) -> list:
    """The findings of the ledgers in the window (``where``/``params``: its SQL), given
    each channel's prompt tokens in it."""
    out: list[Finding] = []
    for suffix, make in ((AT_HEAD, _hoisting), (NO_REASONING, _reasoning)):
        rows = store.query(
            "SELECT r.channel, COUNT(*), SUM(l.tokens_prefix_changed), SUM(l.prompt_tokens),"
            " MIN(l.changed_segment), MAX(l.changed_segment),"
            " SUM(CASE WHEN l.source = 'events' THEN 1 ELSE 0 END)"
            " FROM ledgers l JOIN requests r ON r.request_id = l.request_id"
            f" WHERE l.changed_segment LIKE ?{where}"
            " GROUP BY r.channel ORDER BY r.channel",
            ["%" + suffix, *params],
        )
        for row in rows:
            name = row[0] or "(none)"
            lost = int(row[2] or 0)
            total = prompt_tokens.get(name, 0)
            share = lost / total if total else 0.0
            if share < MIN_SHARE:
                continue
            loss = {
                "channel": name,
                "requests": int(row[1] or 0),
                "recomputed_tokens": lost,
                "share": round(share, 6),
                "per_request": lost // max(int(row[1] or 0), 1),
                "segments": sorted({row[4], row[5]} - {None}),
                "source": "events" if int(row[6] or 0) else "model",
            }
            out.append(make(loss, int(row[3] or 0)))
    return out


def _table(f: dict, prompt: int) -> Table:
    return Table(
        f"requests of channel {f['channel']} whose prompt the template changed",
        ["requests", "their prompt tokens", "recomputed", "per request", "first changed (e.g.)"],
        [
            [
                f["requests"],
                tokens(prompt),
                tokens(f["recomputed_tokens"]),
                tokens(f["per_request"]),
                ", ".join(f["segments"]),
            ]
        ],
    )


def _severity(share: float) -> str:
    return CRITICAL if share >= CRITICAL_SHARE else WARNING


def _hoisting(f: dict, prompt: int) -> Finding:
    ch = f["channel"]
    return Finding(
        kind="template_hoisting",
        severity=_severity(f["share"]),
        title=(
            f"channel {ch}: the upstream's chat template moves each new system message to the "
            f"head; every turn recomputes the conversation ({tokens(f['recomputed_tokens'])} "
            f"prompt tokens, {pct(f['share'])})"
        ),
        summary=[
            f"{f['requests']:,} requests changed at a later system message that the template "
            f"renders in the system prompt at the head ({', '.join(f['segments'])}); the "
            f"{tokens(f['per_request'])} tokens after it were recomputed each time "
            f"(ledger source: {f['source']})",
            "the client appends a system message after its turns (Claude Code's "
            "`<total_tokens>` reminder, its environment); the template gathers them all at the "
            "head (the DeepSeek family's templates do), so the head changes at every turn",
        ],
        fix=[
            f"gateway: `system_in_place: true` on channel {ch} delivers each later system "
            "message as a marked part of the client's turn, where the template renders it in "
            "place (`auto`, the default, does it once the upstream's /tokenize or its "
            "configured `chat_template` shows the hoisting: see /healthz details, rendering)",
            "client: Claude Code without the reminder "
            "(`CLAUDE_CODE_TOTAL_TOKENS_REMINDER=off`, or the setting `totalTokensReminder: "
            "off`); or serve a template that keeps system messages in place "
            "(vLLM's `--chat-template`)",
        ],
        evidence=[_table(f, prompt)],
        facts=f,
    )


def _reasoning(f: dict, prompt: int) -> Finding:
    ch = f["channel"]
    return Finding(
        kind="template_reasoning",
        severity=_severity(f["share"]),
        title=(
            f"channel {ch}: the upstream's chat template renders an assistant's reasoning only "
            f"after the last user query; each new user turn recomputes the tool loop before it "
            f"({tokens(f['recomputed_tokens'])} prompt tokens, {pct(f['share'])})"
        ),
        summary=[
            f"{f['requests']:,} new user turns changed at an assistant message the template "
            f"no longer renders with its reasoning ({', '.join(f['segments'])}); "
            f"{tokens(f['per_request'])} tokens recomputed per such turn "
            f"(ledger source: {f['source']})",
        ],
        fix=[
            f"drop it consistently: `history_thinking: drop` on channel {ch} never sends past "
            "reasoning, so every turn renders the history the same way and the loop hits; "
            "what the model loses: its own reasoning within the current tool loop (the "
            "template keeps it there; docs/rendering.md has the measured hit and sizes)",
            "keep it consistently: serve a template that always renders past reasoning "
            "(vLLM's `--chat-template`): the loop hits, and every later prompt carries the "
            "reasoning tokens of all past turns (more context and prefill per turn)",
            "or accept it: the recompute above, once per new user turn",
        ],
        evidence=[_table(f, prompt)],
        facts=f,
    )
