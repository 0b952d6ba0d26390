"""The reason a request failed, as the record keeps it: short and scrubbed.

``error_type`` says what kind of failure it was; the reason says which (``prompt is too
long: 102001 tokens > 16384 maximum``, ``upstream unreachable: ECONNREFUSED``), so the
doctor can group floods and the dashboard can show why. It comes from the gateway's own
error messages, which may quote the upstream's: secrets are redacted, long quoted values
(an upstream echoing part of the input) are elided, whitespace is collapsed, and the whole
is cut to :data:`MAX_CHARS`.
"""

from __future__ import annotations

import re

from prefixgate.errors import GatewayError
from prefixgate.record.record import Record
from prefixgate.record.redact import redact

MAX_CHARS = 300
QUOTED_MAX = 40  # a quoted value longer than this may be the client's text: elided

_QUOTED = re.compile(r"""(["'`])((?:\\.|(?!\1).){""" + str(QUOTED_MAX + 1) + r""",}?)\1""", re.S)
_SPACE = re.compile(r"\s+")


def scrub(message: str | None) -> str | None:
    """``message`` fit for the record: see the module doc."""
    if not message:
        return None
    text = _SPACE.sub(" ", message).strip()
    text = _QUOTED.sub(lambda m: f"{m.group(1)}…{m.group(1)}", text)
    text = redact(text)
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 1] + "…"


def failed(rec: Record, err: GatewayError) -> None:
    """Mark ``rec`` failed with ``err``: its status, kind and reason."""
    rec.status, rec.error_type = err.status, err.kind
    note = getattr(err, "note", "")  # what a figure in the message is (an estimate)
    rec.error_message = scrub(f"{err.message} ({note})" if note else err.message)


__all__ = ["MAX_CHARS", "failed", "scrub"]
