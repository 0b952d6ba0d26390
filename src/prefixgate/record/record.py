"""The one record type that flows from the gateway to the store, the doctor and the dashboard.

Times are UNIX seconds (float). Token figures are the raw upstream figures (OpenAI
semantics: ``prompt_tokens`` includes ``cached_tokens``); what the client was shown is kept
apart in the ``reported_*`` fields so usage-semantics bugs can be diagnosed afterwards.
"""

from __future__ import annotations

import os
import time

import msgspec

from prefixgate.record.shape import Shape


def new_request_id(ms: int | None = None) -> str:
    """A record's id: a UUIDv7 (RFC 9562) in 32 hex digits. Its first 48 bits are the
    Unix time in milliseconds (``ms``: that time instead of now), so the store's indexes
    on ``request_id`` (the records' and the ledgers') grow at their end, where a random
    id wrote a random page of each per record; its 74 random bits keep it unguessable."""
    if ms is None:
        ms = time.time_ns() // 1_000_000
    r = int.from_bytes(os.urandom(10), "big")  # 80 random bits: 12 + 62 of them used
    v = (ms << 80) | (0x7 << 76) | ((r >> 68) << 64) | (0b10 << 62) | (r & _RAND_B)
    return f"{v:032x}"


_RAND_B = (1 << 62) - 1


class Segment(msgspec.Struct, array_like=True, frozen=True):
    """One piece of a request's prompt, in upstream order.

    ``kind`` is one of ``tools``, ``tool``, ``system``, ``message``; ``name`` says which
    (tool name, ``system[1]``, ``messages[3]:user``). ``hash`` is a stable hex digest of the
    segment's canonical JSON; ``chars`` its size in characters; ``tokens`` an estimate.
    """

    kind: str
    name: str
    hash: str
    chars: int
    tokens: int


class SegmentsRoot(msgspec.Struct, array_like=True, frozen=True):
    """Where a record's stored segment lists begin: the first ``keep_in`` segments of the
    root record's ``segments_in`` (its ``request_id``), then the record's own; likewise
    ``keep_out`` for ``segments_out``, where ``-1`` says that ``segments_out`` is the whole
    of ``segments_in``. Set only on a record as the record writer stores it
    (``record/roots.py``); a record in service holds its whole lists."""

    request_id: str
    keep_in: int
    keep_out: int


class Change(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Where a request stopped extending an earlier one, found at capture time: the
    upstream prompt as sent broke at ``upstream`` (≈ ``at_tokens`` in), and ``segment`` of
    the request as received is what changed, with the ``shape`` of the change (never its
    text). ``scope`` is ``session`` (against the previous request of the same session) or
    ``sessions`` (a session's first request against the previous session's first, same
    client and upstream: what new sessions cannot share). Token figures are estimates
    (chars / 4 of the canonical JSON); ``prompt_estimate`` is the whole prompt's, so
    ``at_tokens / prompt_estimate`` scales to the upstream's count."""

    scope: str
    cls: str
    segment: str
    upstream: str
    kind: str
    at_tokens: int
    lost_tokens: int  # tokens after the break that the earlier request had sent too
    prompt_estimate: int
    shape: Shape | None = None
    known: str | None = None  # a recognised source, e.g. "billing_header"


class Diagnosis(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a request that asked why its cache missed keeps for the next one, and what it
    was answered (``diagnostics/``): digests of its prompt-affecting parameters by name
    (``params``; never their values), the request it was compared with (``previous``),
    the standard answer (``answer``: a reason such as ``system_changed``, ``none`` when
    nothing diverged, ``not_found``, ``unavailable``), the tokens it says were missed and
    where the previous request's fingerprint was found (``memory`` or ``store``)."""

    params: dict[str, str] = {}
    previous: str | None = None
    answer: str | None = None
    missed_tokens: int | None = None
    segment: str | None = None  # the first changed segment, as the client named it
    found_in: str | None = None


class Record(msgspec.Struct, kw_only=True):
    request_id: str
    received_at: float
    first_byte_at: float | None = None
    done_at: float | None = None
    # who
    key_name: str | None = None
    key_owner: str | None = None
    endpoint: str = ""  # "messages" | "chat" | "responses"
    client: str | None = None  # user-agent family, e.g. "claude-cli", "opencode", "openai-python"
    client_version: str | None = None
    session_id: str | None = None
    session_kind: str | None = None  # e.g. "claude-code", "openai-user", None when unknown
    # what
    requested_model: str | None = None
    upstream_model: str | None = None
    channel: str | None = None
    replica: str | None = None
    # where the routing policy's view of the replicas' caches came from: "events" (the
    # engines' KV events), "estimate" (the gateway's own), "events+estimate"; None: no view
    route_source: str | None = None
    stream: bool = False
    status: int = 0
    error_type: str | None = None
    error_message: str | None = None  # short and scrubbed (record/reason.py)
    # raw upstream usage (OpenAI semantics)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    cache_creation_tokens: int | None = None  # cache writes, where an upstream reports them
    # what it cost (spend/prices.py), in nanos (1e-9) of the price table's currency; None
    # without a price or without usage
    cost_nano: int | None = None
    cost_saved_nano: int | None = None  # what the cached tokens saved against fresh input
    # usage as shown to the client (Anthropic semantics on /v1/messages)
    reported_input_tokens: int | None = None
    reported_cache_read_tokens: int | None = None
    reported_output_tokens: int | None = None
    # timing
    latency_ms: float | None = None
    ttft_ms: float | None = None
    retries: int = 0
    # capture: segment hashes of the request as received and as sent upstream
    segments_in: list[Segment] | None = None
    segments_out: list[Segment] | None = None
    # set only as stored: the lists above are then the tails after a root's (SegmentsRoot)
    segments_root: SegmentsRoot | None = None
    # the prefix against the session's previous request: None (not compared), "session"
    # or "sessions" (compared; see Change.scope); ``change`` is set when it broke
    compared: str | None = None
    change: Change | None = None
    # set when the client asked why its cache missed (diagnostics/)
    diagnosis: Diagnosis | None = None
    # full text of segments (content-addressed by Segment.hash), only when capture is opted in
    texts: dict[str, str] | None = None
