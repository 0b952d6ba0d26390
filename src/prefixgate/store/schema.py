"""The store's logical schema, its forward migrations, and Record <-> row conversion.

One logical schema serves both backends; only the spelling of types differs. Tables:

``requests``
    One row per :class:`~prefixgate.record.record.Record`: a surrogate ``id``, one plain
    column per scalar Record field (so the doctor can ``GROUP BY`` endpoint, client, channel,
    model, key and session_kind and ``SUM`` token columns inside the database), and the
    segment lists as JSON arrays of ``[kind, name, hash, chars, tokens]`` (SQLite: TEXT
    usable with ``json_each``; Postgres: ``jsonb`` usable with ``jsonb_array_elements``).
    ``segments_out_same`` is true when the request went upstream with exactly the segments
    it arrived with; ``segments_out`` is then NULL to halve the row (read it as
    ``CASE WHEN segments_out_same THEN segments_in ELSE segments_out END``). A session's
    later records hold only their lists' tails: ``segments_root`` names the session's root
    record (stored whole) whose first ``segments_in_keep`` / ``segments_out_keep``
    segments come before them (``segments_out_keep`` -1: the same as ``segments_in``);
    read them whole through ``store/lists.py`` (record/roots.py says why and when).
    ``captured`` says the request's segment texts were stored. ``request_id`` is unique, so
    writing a record twice (a record replayed from the journal) stores it once.

``segment_texts``
    Content-addressed segment texts: ``hash`` (primary key), ``last_seen`` (the latest
    ``received_at`` of a request that carried it, refreshed at most hourly; retention uses
    it instead of scanning every segment list), ``text`` (canonical JSON, redacted).

``api_keys``
    Keys managed with ``prefixgate keys``: name, owner, SHA-256 digest, models, revocation,
    budgets (a JSON list of lines such as ``"50 USD/month"``).

``owner_budgets``
    Budgets an owner (a team or person owning several keys) was given in the console: the
    owner, its budget lines (JSON, as for a key) and when they were set. They take the
    place of the config's ``budgets.owners`` for that owner.

``admin_failures``, ``admin_good``
    Wrong admin keys per client address and when each address last gave the right one
    (:mod:`prefixgate.admin_attempts`): in the store, so the bound holds across workers.

``dashboard_sessions``, ``dashboard_logins``
    The dashboard's admin sessions: the SHA-256 digest of each session's random token (never
    the token), a fingerprint of the admin key it was opened with, and its times; and recent
    login attempts per client address (the login form's rate limit). In the store, so every
    worker and every gateway replica accepts a session and counts attempts alike.

``ledgers``
    The miss ledger of a request (:class:`~prefixgate.ledger.Ledger`), keyed by its
    ``request_id``: ``source``, its prompt tokens split by cause (``tokens_hit``,
    ``tokens_prefix_changed``, ``tokens_evicted``, ``tokens_elsewhere``,
    ``tokens_partial_block``, ``tokens_cold``, ``tokens_unknown``: they sum to
    ``prompt_tokens``), the first changed segment, the three predictions of the hit
    (``engine_cached``, ``index_predicted``, ``model_predicted``) and the host tier's part.
    ``request_at`` is the request's ``received_at`` (the dashboard's time axis, retention).
    Computed after the record, off the request path; written once per request.

``schema_version``
    One row per applied migration.

Migrations are append-only: never edit a released one, add the next.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter, itemgetter
from typing import Any, TypeVar

import msgspec

from prefixgate.ledger.causes import CAUSES as LEDGER_CAUSES
from prefixgate.ledger.causes import Ledger
from prefixgate.record.journal import SegmentsJson, encode_segments_json
from prefixgate.record.record import Change, Diagnosis, Record, Segment, SegmentsRoot
from prefixgate.store import lists

# How often a text's last_seen is refreshed (seconds); prune keeps this much slack.
LAST_SEEN_GRANULARITY = 3600.0

# Scalar Record fields stored as plain columns, with their logical type.
SCALAR_COLUMNS: list[tuple[str, str]] = [
    ("request_id", "text_notnull"),
    ("received_at", "real_notnull"),
    ("first_byte_at", "real"),
    ("done_at", "real"),
    ("key_name", "text"),
    ("key_owner", "text"),
    ("endpoint", "text_notnull"),
    ("client", "text"),
    ("client_version", "text"),
    ("session_id", "text"),
    ("session_kind", "text"),
    ("requested_model", "text"),
    ("upstream_model", "text"),
    ("channel", "text"),
    ("replica", "text"),
    ("stream", "bool"),
    ("status", "int"),
    ("error_type", "text"),
    ("prompt_tokens", "int"),
    ("cached_tokens", "int"),
    ("completion_tokens", "int"),
    ("reported_input_tokens", "int"),
    ("reported_cache_read_tokens", "int"),
    ("reported_output_tokens", "int"),
    ("latency_ms", "real"),
    ("ttft_ms", "real"),
    ("retries", "int"),
    ("route_source", "text"),  # migration 6
]
# The columns migration 6 added: migration 1 creates the table without them.
_ADDED_LATER = {"route_source"}
SEGMENT_COLUMNS: list[tuple[str, str]] = [
    ("segments_in", "json"),
    ("segments_out", "json"),
    ("segments_out_same", "bool"),
    ("captured", "bool"),
]
# Scalar Record fields added by migration 5 (what a request cost, spend/prices.py): the
# cache writes an upstream reported, the cost and the cost the cache saved, in nanos of
# the price table's currency (integers: sums are exact).
COST_COLUMNS: list[tuple[str, str]] = [
    ("cache_creation_tokens", "int"),
    ("cost_nano", "int"),
    ("cost_saved_nano", "int"),
]
# Columns added to ``requests`` by migration 8.
# ``error_message``: the failure's short, scrubbed reason. ``compared``, ``change_*``:
# the prefix against the session's previous request, found at capture time
# (record/changes.py): ``change_class`` and ``change_segment`` name the change,
# ``change_at`` and ``change_lost`` are the shares of the prompt before the break and
# re-sent after it (× ``prompt_tokens`` gives tokens in the database), ``change`` the
# whole :class:`~prefixgate.record.record.Change` with its shape.
ADDED_COLUMNS: list[tuple[str, str]] = [
    ("error_message", "text"),
    ("compared", "text"),
    ("change_class", "text"),
    ("change_segment", "text"),
    ("change_at", "real"),
    ("change_lost", "real"),
    ("change", "json"),
]
# Columns added to ``requests`` by migration 9: ``diagnosis``, what a request that asked
# why its cache missed keeps for the next (its parameters' digests) and was answered
# (:class:`~prefixgate.record.record.Diagnosis`, diagnostics/).
DIAGNOSIS_COLUMNS: list[tuple[str, str]] = [("diagnosis", "json")]
# Columns added to ``requests`` by migration 13: a record stored as a difference to its
# session's root record (record/roots.py): the root's ``request_id`` and how many of its
# segments each list keeps before the row's own (``segments_out_keep`` -1: the same as
# ``segments_in``); NULL for a record stored whole.
ROOT_COLUMNS: list[tuple[str, str]] = [
    ("segments_root", "text"),
    ("segments_in_keep", "int"),
    ("segments_out_keep", "int"),
]
# Every column written for a request, in insert order (``id`` excluded).
COLUMNS: list[str] = [
    name
    for name, _ in SCALAR_COLUMNS
    + SEGMENT_COLUMNS
    + COST_COLUMNS
    + ADDED_COLUMNS
    + DIAGNOSIS_COLUMNS
    + ROOT_COLUMNS
]
SCALAR_NAMES: list[str] = [name for name, _ in SCALAR_COLUMNS]
COST_NAMES: list[str] = [name for name, _ in COST_COLUMNS]

TYPES: dict[str, dict[str, str]] = {
    "sqlite": {
        "id": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "text": "TEXT",
        "text_notnull": "TEXT NOT NULL",
        "real": "REAL",
        "real_notnull": "REAL NOT NULL",
        "int": "INTEGER",
        "bool": "INTEGER NOT NULL DEFAULT 0",
        "json": "TEXT",
    },
    "postgres": {
        "id": "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
        "text": "TEXT",
        "text_notnull": "TEXT NOT NULL",
        "real": "DOUBLE PRECISION",
        "real_notnull": "DOUBLE PRECISION NOT NULL",
        "int": "BIGINT",
        "bool": "BOOLEAN NOT NULL DEFAULT FALSE",
        "json": "JSONB",
    },
}


def _migration_1(dialect: str) -> list[str]:
    t = TYPES[dialect]
    first = [c for c in SCALAR_COLUMNS + SEGMENT_COLUMNS if c[0] not in _ADDED_LATER]
    cols = ",\n  ".join(f"{name} {t[kind]}" for name, kind in first)
    return [
        f"CREATE TABLE requests (\n  id {t['id']},\n  {cols}\n)",
        "CREATE UNIQUE INDEX requests_request_id ON requests (request_id)",
        "CREATE INDEX requests_received_at ON requests (received_at, id)",
        f"CREATE TABLE segment_texts (hash TEXT PRIMARY KEY, last_seen {t['real_notnull']},"
        " text TEXT NOT NULL)",
    ]


def _migration_2(dialect: str) -> list[str]:
    # The doctor walks each session's requests in order.
    return ["CREATE INDEX requests_session ON requests (session_id, received_at)"]


def _migration_3(dialect: str) -> list[str]:
    # API keys managed with `prefixgate keys create | list | revoke`: digests only.
    t = TYPES[dialect]
    return [
        "CREATE TABLE api_keys (name TEXT PRIMARY KEY, owner TEXT, digest TEXT NOT NULL UNIQUE,"
        f" models TEXT NOT NULL, created_at {t['real_notnull']}, revoked_at {t['real']})"
    ]


def _migration_4(dialect: str) -> list[str]:
    # Dashboard admin sessions and login attempts (store/sessions.py, web/login.py).
    real = TYPES[dialect]["real_notnull"]
    return [
        "CREATE TABLE dashboard_sessions (digest TEXT PRIMARY KEY, admin TEXT NOT NULL,"
        f" created_at {real}, last_seen {real}, expires_at {real})",
        f"CREATE TABLE dashboard_logins (address TEXT NOT NULL, at {real})",
        "CREATE INDEX dashboard_logins_address ON dashboard_logins (address, at)",
    ]


def _migration_5(dialect: str) -> list[str]:
    # What each request cost (COST_COLUMNS) and each store key's budgets.
    t = TYPES[dialect]
    return [
        *(f"ALTER TABLE requests ADD COLUMN {name} {t[kind]}" for name, kind in COST_COLUMNS),
        "ALTER TABLE api_keys ADD COLUMN budgets TEXT",
    ]


def _migration_6(dialect: str) -> list[str]:
    # Where routing's view of the replicas' caches came from (routing: precise).
    return [f"ALTER TABLE requests ADD COLUMN route_source {TYPES[dialect]['text']}"]


# The ``ledgers`` table as migration 7 created it: (column, logical type, Ledger field).
LEDGER_COLUMNS_7: list[tuple[str, str, str]] = [
    ("request_id", "text_notnull", "request_id"),
    ("request_at", "real_notnull", "received_at"),
    ("source", "text_notnull", "source"),
    ("prompt_tokens", "int", "prompt_tokens"),
    ("block_size", "int", "block_size"),
    *((f"tokens_{c}", "int", c) for c in LEDGER_CAUSES),
    ("changed_segment", "text", "changed_segment"),
    ("changed_index", "int", "changed_index"),
    ("elsewhere_replica", "text", "elsewhere_replica"),
    ("engine_cached", "int", "engine_cached"),
    ("index_predicted", "int", "index_predicted"),
    ("model_predicted", "int", "model_predicted"),
    ("host_hit", "int", "host_hit"),
    ("host_missed", "int", "host_missed"),
]
# Added by migration 12: evicted tokens whose removal was a cache clear.
LEDGER_ADDED_COLUMNS: list[tuple[str, str, str]] = [("tokens_cleared", "int", "cleared")]
LEDGER_COLUMNS = [*LEDGER_COLUMNS_7, *LEDGER_ADDED_COLUMNS]


def _migration_7(dialect: str) -> list[str]:
    # The miss ledger of each request (ledger/), written after its record.
    t = TYPES[dialect]
    cols = ",\n  ".join(f"{name} {t[kind]}" for name, kind, _ in LEDGER_COLUMNS_7)
    return [
        f"CREATE TABLE ledgers (\n  {cols}\n)",
        "CREATE UNIQUE INDEX ledgers_request_id ON ledgers (request_id)",
        "CREATE INDEX ledgers_request_at ON ledgers (request_at)",
    ]


def _migration_8(dialect: str) -> list[str]:
    # The error reason and the prefix change of each request (ADDED_COLUMNS).
    t = TYPES[dialect]
    return [f"ALTER TABLE requests ADD COLUMN {name} {t[kind]}" for name, kind in ADDED_COLUMNS]


def _migration_9(dialect: str) -> list[str]:
    # What a request that asked for diagnostics keeps and was answered (DIAGNOSIS_COLUMNS).
    t = TYPES[dialect]
    return [f"ALTER TABLE requests ADD COLUMN {name} {t[kind]}" for name, kind in DIAGNOSIS_COLUMNS]


def _migration_10(dialect: str) -> list[str]:
    # The console's audit log (web/console.py): who changed which key or budget, when; the
    # detail never holds a key, only names, budgets and digests' first characters.
    t = TYPES[dialect]
    return [
        f"CREATE TABLE audit_log (at {t['real_notnull']}, actor TEXT NOT NULL,"
        " action TEXT NOT NULL, target TEXT, detail TEXT)",
        "CREATE INDEX audit_log_at ON audit_log (at)",
    ]


def _migration_11(dialect: str) -> list[str]:
    # Owners' budgets set in the console (web/console.py), and the admin credential checks'
    # failures and good addresses (admin_attempts.py), shared by every worker and replica.
    real = TYPES[dialect]["real_notnull"]
    return [
        f"CREATE TABLE owner_budgets (owner TEXT PRIMARY KEY, budgets TEXT NOT NULL, at {real})",
        f"CREATE TABLE admin_failures (id TEXT PRIMARY KEY, address TEXT NOT NULL, at {real})",
        "CREATE INDEX admin_failures_address ON admin_failures (address, at)",
        f"CREATE TABLE admin_good (address TEXT PRIMARY KEY, at {real})",
    ]


def _migration_12(dialect: str) -> list[str]:
    # The ledger's ``cleared``: evicted tokens lost to a cache clear (LEDGER_ADDED_COLUMNS).
    t = TYPES[dialect]
    return [
        f"ALTER TABLE ledgers ADD COLUMN {name} {t[kind]}" for name, kind, _ in LEDGER_ADDED_COLUMNS
    ]


def _migration_13(dialect: str) -> list[str]:
    # Segment lists stored as a difference to the session's root record (ROOT_COLUMNS).
    t = TYPES[dialect]
    return [f"ALTER TABLE requests ADD COLUMN {name} {t[kind]}" for name, kind in ROOT_COLUMNS]


# Forward migrations; index i holds version i + 1. Migration 1 creates the tables as they
# first were; later ones add to them.
MIGRATIONS = [
    _migration_1,
    _migration_2,
    _migration_3,
    _migration_4,
    _migration_5,
    _migration_6,
    _migration_7,
    _migration_8,
    _migration_9,
    _migration_10,
    _migration_11,
    _migration_12,
    _migration_13,
]
LATEST_VERSION = len(MIGRATIONS)
LEDGER_VERSION = MIGRATIONS.index(_migration_7) + 1  # the first with the ``ledgers`` table
CLEARED_VERSION = MIGRATIONS.index(_migration_12) + 1  # the first with ``tokens_cleared``

SCHEMA_VERSION_DDL = (
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at {real})"
)


# -- Record <-> row --------------------------------------------------------------------

_SEGMENTS_ENCODER = msgspec.json.Encoder()
_CHANGE_DECODER = msgspec.json.Decoder(Change)
_DIAGNOSIS_DECODER = msgspec.json.Decoder(Diagnosis)
_FIELD_INDEX = {name: i for i, name in enumerate(Record.__struct_fields__)}
_SCALAR_INDEX = [_FIELD_INDEX[name] for name in SCALAR_NAMES]
_COST_INDEX = [_FIELD_INDEX[name] for name in COST_NAMES]
_STREAM_POS = SCALAR_NAMES.index("stream")
# each a tuple of the values at those places, taken in C (of two places or more: a
# getter of one place gives the value itself)
if len(_SCALAR_INDEX) < 2 or len(_COST_INDEX) < 2:
    raise RuntimeError("record_row takes its columns as tuples")
_SCALARS = itemgetter(*_SCALAR_INDEX)
_COSTS = itemgetter(*_COST_INDEX)


def encode_segments(segments: Sequence[Segment] | None) -> str | None:
    if segments is None:
        return None
    return _SEGMENTS_ENCODER.encode(segments).decode()


def _text(data: bytes) -> str:
    return data.decode()


def record_row(
    record: Record,
    segments: SegmentsJson | None = None,
    json: Callable[[bytes], Any] = _text,
) -> tuple[Any, ...]:
    """The ``requests`` row of a record, in :data:`COLUMNS` order. ``segments``: its
    segment lists already encoded (the journal's), else they are encoded here; ``json``
    makes a segments column's value of their JSON (default: the text)."""
    values = msgspec.structs.astuple(record)
    row = list(_SCALARS(values))
    row[_STREAM_POS] = bool(row[_STREAM_POS])
    if segments is None:
        segments = encode_segments_json(record.segments_in, record.segments_out)
    seg_in, seg_out, same = segments
    root = record.segments_root
    if root is not None:  # the lists are tails: "same" is the whole lists', not theirs
        same = root.keep_out < 0
    row.append(None if seg_in is None else json(seg_in))
    row.append(None if same or seg_out is None else json(seg_out))
    row.append(same)
    row.append(bool(record.texts))
    row += _COSTS(values)
    row.append(record.error_message)
    row.append(record.compared)
    c = record.change
    if c is None:
        row += [None, None, None, None, None]
    else:
        scale = max(c.prompt_estimate, 1)
        row += [
            c.cls,
            c.segment,
            min(c.at_tokens / scale, 1.0),
            min(c.lost_tokens / scale, 1.0),
            json(_SEGMENTS_ENCODER.encode(c)),
        ]
    d = record.diagnosis
    row.append(None if d is None else json(_SEGMENTS_ENCODER.encode(d)))
    if root is None:
        row += [None, None, None]
    else:
        row += [root.request_id, root.keep_in, root.keep_out]
    return tuple(row)


_T = TypeVar("_T")


def _decoded(decoder: msgspec.json.Decoder[_T], value: str | bytes | None) -> _T | None:
    """A JSON column as read (text on both backends: Postgres casts it)."""
    if value is None:
        return None
    try:
        return decoder.decode(value)
    except msgspec.ValidationError:  # written by a later version: unread, not fatal
        return None


def decode_change(value: str | bytes | None) -> Change | None:
    """A ``change`` column as read."""
    return _decoded(_CHANGE_DECODER, value)


def decode_diagnosis(value: str | bytes | None) -> Diagnosis | None:
    """A ``diagnosis`` column as read."""
    return _decoded(_DIAGNOSIS_DECODER, value)


def row_record(row: Sequence[Any]) -> tuple[Record, bool]:
    """Rebuild a record from a row in :data:`COLUMNS` order; also says if it was captured."""
    n = len(SCALAR_NAMES)
    kwargs = dict(zip(SCALAR_NAMES, row[:n], strict=True))
    kwargs["stream"] = bool(kwargs["stream"])
    seg_in = lists.decode(row[n])
    seg_out = list(seg_in) if row[n + 2] and seg_in is not None else lists.decode(row[n + 1])
    kwargs.update(zip(COST_NAMES, row[n + 4 : n + 4 + len(COST_NAMES)], strict=True))
    names = (name for name, _ in ADDED_COLUMNS + DIAGNOSIS_COLUMNS + ROOT_COLUMNS)
    added = dict(zip(names, row[n + 4 + len(COST_NAMES) :], strict=True))
    root_id = added["segments_root"]
    record = Record(
        **kwargs,
        segments_in=seg_in,
        segments_out=seg_out,
        error_message=added["error_message"],
        compared=added["compared"],
        change=decode_change(added["change"]),
        diagnosis=decode_diagnosis(added["diagnosis"]),
        segments_root=None
        if root_id is None
        else SegmentsRoot(
            root_id, int(added["segments_in_keep"] or 0), int(added["segments_out_keep"] or 0)
        ),
    )
    return record, bool(row[n + 3])


def batch_texts(records: Sequence[Record]) -> dict[str, tuple[str, float]]:
    """Distinct texts of a batch: hash -> (text, latest received_at carrying it)."""
    out: dict[str, tuple[str, float]] = {}
    for record in records:
        if not record.texts:
            continue
        at = record.received_at
        for h, text in record.texts.items():
            seen = out.get(h)
            if seen is None or seen[1] < at:
                out[h] = (text, at)
    return out


def segment_hashes(record: Record) -> list[str]:
    hashes: dict[str, None] = {}
    for segs in (record.segments_in, record.segments_out):
        for seg in segs or ():
            hashes[seg.hash] = None
    return list(hashes)


_LEDGER_VALUES = attrgetter(*[name for _, _, name in LEDGER_COLUMNS])  # a tuple, in C


def ledger_row(ledger: Ledger) -> tuple[Any, ...]:
    """The ``ledgers`` row of a ledger, in :data:`LEDGER_COLUMNS` order."""
    return _LEDGER_VALUES(ledger)


def row_ledger(row: Sequence[Any]) -> Ledger:
    """A ledger from a row in :data:`LEDGER_COLUMNS` order."""
    values = {name: value for (_, _, name), value in zip(LEDGER_COLUMNS, row, strict=True)}
    for _, kind, name in LEDGER_COLUMNS:
        if kind == "int" and values[name] is not None:
            values[name] = int(values[name])
    for name in ("host_hit", "host_missed", "cleared", *LEDGER_CAUSES):
        values[name] = values[name] or 0
    return Ledger(**values)
