"""The catalog of known volatile client markers: text a client puts into its prompt that
changes between requests (or sessions), where it appears, whether it is safe where the
client put it, the gateway's hygiene step for it, how it is detected, and the public
report it came from. docs/rendering.md shows this table (a test keeps them equal).

Detection reads a segment's text at capture time, in memory, and keeps only the marker's
name on the record (``known``), never the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MARKERS", "Marker", "known_marker", "markers_table"]


@dataclass(frozen=True, slots=True)
class Marker:
    name: str  # the record's ``known`` label
    client: str
    looks_like: str
    where: str  # where it appears in the request
    in_place: str  # whether it is safe where the client put it
    hygiene: str  # the gateway's step (and setting)
    detection: str  # how the gateway and the doctor know it
    report: str  # the public report it came from
    pattern: re.Pattern[str]

    def found_in(self, text: str) -> bool:
        return self.pattern.search(text) is not None


MARKERS: tuple[Marker, ...] = (
    Marker(
        name="billing_header",
        client="Claude Code",
        looks_like="x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=cli;",
        where="system[0], a text block of its own, at token 0 of the flattened system prompt",
        in_place=(
            "no: its 3-hex suffix changes per session (and `cch=` per request on the vendor's "
            "host), and at token 0 it changes every block after it"
        ),
        hygiene="strip_billing_header (`strip_anthropic_billing_header`, on for openai channels)",
        detection=(
            "capture: a changed system block whose text starts with the header; the doctor's "
            "breakers and segments name it"
        ),
        report="the billing-header incident; vLLM drops the line itself since its billing-header fix",
        pattern=re.compile(r"^\s*x-anthropic-billing-header:"),
    ),
    Marker(
        name="total_tokens_reminder",
        client="Claude Code (2.1.2xx on; `CLAUDE_CODE_TOTAL_TOKENS_REMINDER`)",
        looks_like="<total_tokens>187919 tokens left</total_tokens>",
        where=(
            "a new `role: system` message after each user prompt and tool result (earlier "
            "ones unchanged), and the end of the system prompt (2.1.332: the window, constant)"
        ),
        in_place=(
            "yes where the template renders system messages in place (the prompt only "
            "grows); no where it gathers them at the head (DeepSeek family): each new one "
            "changes the head"
        ),
        hygiene=(
            "system_in_place (`system_in_place: auto`, on where the upstream's template was "
            "seen to hoist): each later system message delivered as a marked part of the turn "
            "it follows"
        ),
        detection=(
            "capture: a changed system segment holding the marker; the ledger's "
            "`changed_segment` ending `:system@head`; the doctor's `template_hoisting`"
        ),
        report=(
            "omlx issue 2881 and PR 2882, cc-switch PR 7428, claude-code issue 96101 "
            "(DeepSeek hit rate 90% to ~10%)"
        ),
        pattern=re.compile(r"<total_tokens>\s*\d+ tokens left\s*</total_tokens>"),
    ),
)


def known_marker(text: str) -> str | None:
    """The name of the first catalogued marker in ``text`` (None: none)."""
    for m in MARKERS:
        if m.found_in(text):
            return m.name
    return None


def markers_table() -> str:
    """The catalog as the markdown table of docs/rendering.md."""
    head = (
        "| marker | client | looks like | where | safe in place? | hygiene step | detection "
        "| public report |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    rows = [
        f"| `{m.name}` | {m.client} | `{m.looks_like}` | {m.where} | {m.in_place} | "
        f"{m.hygiene} | {m.detection} | {m.report} |"
        for m in MARKERS
    ]
    return head + "\n".join(rows) + "\n"
