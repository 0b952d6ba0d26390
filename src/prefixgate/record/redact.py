"""Redaction of secrets from captured segment texts, before they are stored.

Only the stored text is redacted; a segment's hash is always the hash of the original, so
hashes stay comparable with requests captured elsewhere. Over-redacting is accepted: a
captured text is for diagnosis, not for replay.

Each pattern starts with a literal or a small character class so ``re`` can skip through
a 100 KB text quickly (one case-insensitive alternation over the whole text is ~10x slower).
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"

# Anthropic / OpenAI style keys: sk-ant-api03-…, sk-proj-…, sk-…
_SK = re.compile(r"sk-[A-Za-z0-9_\-]{16,}")
# The gateway's own keys (`prefixgate keys new` / `keys create`): pg- and 43 characters of
# secrets.token_urlsafe(32)
_PG = re.compile(r"pg-[A-Za-z0-9_\-]{32,}")
# Authorization: Bearer <token>
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=\-]{8,}")
# Well-known token shapes: GitHub, Slack, AWS access key ids, Google API keys.
_SHAPES = re.compile(
    r"(?:gh[pousr]_[A-Za-z0-9]{20,}|xox[abposr]-[A-Za-z0-9\-]{10,}"
    r"|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_\-]{35})"
)
# "= value" / ": value" where the value is a long hex/base64-ish token (letters AND digits);
# quotes may be JSON-escaped since texts are JSON.
_ASSIGNED = re.compile(
    r"([:=][ \t]*\\?[\"']?[ \t]*)"
    r"(?=[A-Za-z0-9+/_\-]*[0-9])(?=[A-Za-z0-9+/_\-]*[A-Za-z])[A-Za-z0-9+/_\-]{16,}={0,2}"
)
# ... and the name it is assigned to ends in key/token/secret/password/credential.
_SECRET_NAME = re.compile(
    r"(?i:key|token|secret|passw(?:or)?d|passwd|credential)s?[A-Za-z0-9_\-]*\\?[\"']?[ \t]*$"
)
_NAME_WINDOW = 64


def _alnum_before(text: str, i: int) -> bool:
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


def redact(text: str) -> str:
    """``text`` with everything that looks like an API key, bearer token or secret value
    replaced by ``<redacted>``."""
    if "sk-" in text:
        text = _SK.sub(lambda m: m.group(0) if _alnum_before(text, m.start()) else REDACTED, text)
    if "pg-" in text:
        text = _PG.sub(lambda m: m.group(0) if _alnum_before(text, m.start()) else REDACTED, text)
    if "Bearer" in text:
        text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    text = _SHAPES.sub(REDACTED, text)

    def assigned(m: re.Match[str]) -> str:
        start = m.start()
        if _SECRET_NAME.search(text, max(0, start - _NAME_WINDOW), start):
            return m.group(1) + REDACTED
        return m.group(0)

    return _ASSIGNED.sub(assigned, text)
