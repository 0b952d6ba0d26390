"""Claude Code's billing header at token 0.

Claude Code puts ``x-anthropic-billing-header: cc_version=…; cc_entrypoint=…; [cch=…;]`` in
``system[0]``. Flattened into an OpenAI system prompt it lands at token 0 of the upstream
prompt, and since prefix-cache block hashes are chained, anything that varies there (a
per-session version suffix, a per-request ``cch=``) invalidates every block after it. The
vendor's own API reads the header, so this runs only on the Messages → ``openai`` path.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from prefixgate.protocol.messages_body import Request

PREFIX = "x-anthropic-billing-header:"
_HEADER = re.compile(r"\s*" + re.escape(PREFIX))
# A raw JSON string's opening quote and leading ASCII blanks (as bytes or escapes).
_RAW_BLANKS = re.compile(rb'"(?: |\\[ntfr])*')
_RAW_PREFIX = PREFIX.encode()


def is_billing_header(text: str) -> bool:
    """Whether the text, leading blanks aside, starts with the header."""
    return _HEADER.match(text) is not None


def strip_billing_header(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Return ``(body, removed)``. A system text block whose trimmed text starts with the
    header is dropped; for a string system, its first line if it is such a header."""
    system = body.get("system")
    if isinstance(system, list):
        kept = [
            b
            for b in system
            if not (
                isinstance(b, dict)
                and b.get("type") == "text"
                and is_billing_header(b.get("text", ""))
            )
        ]
        if len(kept) != len(system):
            return {**body, "system": kept}, True
    elif isinstance(system, str) and is_billing_header(system.split("\n", 1)[0]):
        rest = system.split("\n", 1)[1] if "\n" in system else ""
        return {**body, "system": rest}, True
    return body, False


def strip_billing_header_typed(req: Request) -> tuple[Request, bool]:
    """``strip_billing_header`` for a typed request (system texts raw)."""
    system = req.system
    if isinstance(system, list):
        kept = [b for b in system if not _raw_is_header(b.text)]
        if len(kept) != len(system):
            return msgspec.structs.replace(req, system=kept), True
    elif isinstance(system, str):
        plain, removed = strip_billing_header({"system": system})
        if removed:
            return msgspec.structs.replace(req, system=plain["system"]), True
    return req, False


def _raw_is_header(raw: msgspec.Raw) -> bool:
    """``is_billing_header`` of a raw JSON string, told by its first bytes; decoded only
    when its leading blanks are not plain ASCII ones."""
    head = bytes(memoryview(raw)[:96])
    rest = head[_RAW_BLANKS.match(head).end() :]
    if rest.startswith(_RAW_PREFIX):
        return True
    if (
        (len(rest) < len(_RAW_PREFIX) and len(head) == 96)  # blanks past the head
        or rest[:1] == b"\\"  # an escape: \u00a0 is a blank, say
        or (rest[:1] >= b"\x80" and rest[:4].decode("utf-8", "ignore")[:1].isspace())
    ):
        return is_billing_header(msgspec.json.decode(raw))
    return False
