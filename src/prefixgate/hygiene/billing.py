"""Claude Code's billing header at token 0.

Claude Code puts ``x-anthropic-billing-header: cc_version=…; cc_entrypoint=…; [cch=…;]`` in
``system[0]``. Flattened into an OpenAI system prompt it lands at token 0 of the upstream
prompt, and since prefix-cache block hashes are chained, anything that varies there (a
per-session version suffix, a per-request ``cch=``) invalidates every block after it. The
vendor's own API reads the header, so this runs only on the Messages → ``openai`` path.
"""

from __future__ import annotations

PREFIX = "x-anthropic-billing-header:"


def is_billing_header(text: str) -> bool:
    return text.strip().startswith(PREFIX)


def strip_billing_header(body: dict) -> tuple[dict, bool]:
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
