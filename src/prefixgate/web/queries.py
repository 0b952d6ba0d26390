"""The dashboard's reads: every aggregation runs inside the database, in portable SQL
(``?`` placeholders, ``CASE``, ``CAST … AS BIGINT``, window functions, ``UNION ALL``) that
SQLite and Postgres both run through :meth:`Store.query`. Functions here are synchronous;
the routes call them through ``asyncio.to_thread``. Results are plain JSON-able data."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict
from typing import Any

import msgspec

from prefixgate.doctor import distribution as dist_mod
from prefixgate.record.segments import first_changed
from prefixgate.store import Store, lists
from prefixgate.store.schema import decode_change
from prefixgate.web.scope import DIMENSIONS, ERROR, FILTERS, NONE, OK, BadParam, Scope

MAX_GROUPS = 6  # series drawn per chart; the rest are summed as "other"
TARGET_BUCKETS = 48
# Bucket widths (seconds) a time axis may use.
WIDTHS = (
    *(0.05, 0.1, 0.2, 0.25, 0.5),
    *(1, 2, 5, 10, 15, 30),
    *(60, 120, 300, 600, 900, 1800),
    *(3600, 7200, 10800, 21600, 43200),
    *(86400, 2 * 86400, 7 * 86400),
)
PERCENTILES = (50, 90, 99)


def as_int(v: Any) -> int:
    """A figure read from a row as an int: NULL (an empty window's SUM) is 0."""
    return int(v or 0)


def _f(v: Any) -> float | None:
    return None if v is None else float(v)


def _name(v: Any) -> str:
    return NONE if v is None else str(v)


def _rate(prompt: int, cached: int) -> float | None:
    return cached / prompt if prompt else None


def bucket_floor(expr: str) -> str:
    """floor(expr) in both dialects: SQLite's CAST truncates, Postgres's rounds."""
    return f"(CAST({expr} AS BIGINT) - CASE WHEN CAST({expr} AS BIGINT) > {expr} THEN 1 ELSE 0 END)"


def _bucket(origin: float, width: float) -> tuple[str, list[float]]:
    x = "((received_at - ?) / ?)"
    return bucket_floor(x), [float(origin), float(width)] * 3


def bucket_width(span: float, target: int = TARGET_BUCKETS) -> float:
    for w in WIDTHS:
        if span / w <= target:
            return float(w)
    return float(WIDTHS[-1])


# Sums over a set of requests, in this column order everywhere.
_SUMS = (
    "COUNT(*),"
    f" SUM(CASE WHEN {ERROR} THEN 1 ELSE 0 END),"
    f" SUM(CASE WHEN {OK} THEN prompt_tokens ELSE 0 END),"
    f" SUM(CASE WHEN {OK} THEN COALESCE(cached_tokens, 0) ELSE 0 END),"
    f" SUM(CASE WHEN {OK} THEN COALESCE(completion_tokens, 0) ELSE 0 END)"
)


def _sums(row: tuple) -> dict[str, Any]:
    n, err, prompt, cached, completion = (as_int(v) for v in row)
    return {
        "requests": n,
        "errors": err,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": completion,
        "hit_rate": _rate(prompt, cached),
    }


def percentiles(
    store: Store, scope: Scope, keys: list[str], key_params: list[Any] | None = None
) -> dict[tuple, dict[str, Any]]:
    """TTFT percentiles (nearest rank) of successful requests, per value of ``keys``
    (SQL expressions), computed with window functions in the database."""
    where, params = scope.where()
    aliases = [f"k{i}" for i in range(len(keys))]
    sel = ", ".join(f"{k} AS {a}" for k, a in zip(keys, aliases, strict=True))
    part = ", ".join(aliases)
    cols = ", ".join(f"MIN(CASE WHEN rn * 100 >= {p} * cnt THEN v END)" for p in PERCENTILES)
    sql = (
        f"SELECT {part}, COUNT(*), {cols} FROM ("
        f"SELECT {part}, v, ROW_NUMBER() OVER (PARTITION BY {part} ORDER BY v) AS rn,"
        f" COUNT(*) OVER (PARTITION BY {part}) AS cnt FROM ("
        f"SELECT {sel}, ttft_ms AS v FROM requests"
        f" WHERE ttft_ms IS NOT NULL AND {OK}{where}) AS x) AS y"
        f" GROUP BY {part}"
    )
    out = {}
    for row in store.query(sql, [*(key_params or []), *params]):
        k = tuple(row[: len(keys)])
        values = row[len(keys) :]
        out[k] = {"n": as_int(values[0])} | {
            f"p{p}": _f(v) for p, v in zip(PERCENTILES, values[1:], strict=True)
        }
    return out


# -- meta -------------------------------------------------------------------------------


def meta(store: Store, scope: Scope, limit: int = 100) -> dict[str, Any]:
    """The values each filter can take in the window (most requests first) and the
    window's extent."""
    where, params = scope.where()
    names = [n for n in FILTERS if n not in ("session", "replica")]
    parts = [
        f"SELECT '{n}', {FILTERS[n]}, COUNT(*) FROM requests WHERE 1 = 1{where}"
        f" GROUP BY {FILTERS[n]}"
        for n in names
    ]
    values: dict[str, list[dict]] = {n: [] for n in names}
    for dim, value, n in store.query(" UNION ALL ".join(parts), params * len(parts)):
        values[dim].append({"value": _name(value), "requests": as_int(n)})
    for v in values.values():
        v.sort(key=lambda x: (-x["requests"], x["value"]))
        del v[limit:]
    [(first, last, count)] = store.query(
        f"SELECT MIN(received_at), MAX(received_at), COUNT(*) FROM requests WHERE 1 = 1{where}",
        params,
    )
    [(all_first, all_last, all_count)] = store.query(
        "SELECT MIN(received_at), MAX(received_at), COUNT(*) FROM requests"
    )
    return {
        "values": values,
        "window": {"first": _f(first), "last": _f(last), "requests": as_int(count)},
        "store": {"first": _f(all_first), "last": _f(all_last), "requests": as_int(all_count)},
    }


# -- overview ---------------------------------------------------------------------------


def overview(store: Store, scope: Scope, by: str) -> dict[str, Any]:
    """Totals, the hit rate / requests / tokens over time split by ``by``, TTFT
    percentiles over time, and every dimension's slices."""
    column = DIMENSIONS[by]
    where, params = scope.where()
    [row] = store.query(
        f"SELECT {_SUMS}, COUNT(DISTINCT session_id), MIN(received_at), MAX(received_at)"
        f" FROM requests WHERE 1 = 1{where}",
        params,
    )
    totals = _sums(row[:5]) | {"sessions": as_int(row[5])}
    first, last = _f(row[6]), _f(row[7])
    overall = percentiles(store, scope, ["0"]).get((0,), {})
    totals["ttft"] = overall
    out: dict[str, Any] = {
        "by": by,
        "totals": totals,
        "series": None,
        "slices": slices(store, scope),
    }
    if first is None or last is None:
        return out
    width = bucket_width(max(last - first, 1e-3))
    origin = (first // width) * width
    bsql, bparams = _bucket(origin, width)
    rows = store.query(
        f"SELECT {bsql}, {column}, {_SUMS} FROM requests WHERE 1 = 1{where} GROUP BY 1, 2",
        bparams + params,
    )
    # The biggest groups by prompt tokens get their own series.
    weight: dict[str, int] = defaultdict(int)
    for r in rows:
        weight[_name(r[1])] += as_int(r[4]) or as_int(r[2])
    ranked = sorted(weight, key=lambda g: (-weight[g], g))
    kept = set(ranked[:MAX_GROUPS]) if len(ranked) <= MAX_GROUPS else set(ranked[: MAX_GROUPS - 1])
    cells: dict[str, dict[int, list[int]]] = defaultdict(dict)
    for r in rows:
        g = _name(r[1]) if _name(r[1]) in kept else "other"
        acc = cells[g].setdefault(as_int(r[0]), [0, 0, 0, 0, 0])
        for i, v in enumerate(r[2:7]):
            acc[i] += as_int(v)
    n_buckets = int((last - origin) // width) + 1
    order = [g for g in ranked if g in kept] + (["other"] if "other" in cells else [])
    groups = []
    for g in order:
        points = []
        for b in range(n_buckets):
            acc = cells[g].get(b)
            points.append(_sums(acc) if acc else None)
        groups.append({"name": g, "points": points})
    ttft = percentiles(store, scope, [bsql], bparams)
    out["series"] = {
        "origin": origin,
        "width": width,
        "buckets": n_buckets,
        "t": [origin + b * width for b in range(n_buckets)],
        "groups": groups,
        "ttft": [ttft.get((b,)) for b in range(n_buckets)],
    }
    return out


def slices(store: Store, scope: Scope) -> dict[str, list[dict]]:
    """For every dimension, the requests and hit rate of each of its values."""
    where, params = scope.where()
    parts = [
        f"SELECT '{name}', {col}, {_SUMS} FROM requests WHERE 1 = 1{where} GROUP BY {col}"
        for name, col in DIMENSIONS.items()
    ]
    out: dict[str, list[dict]] = {name: [] for name in DIMENSIONS}
    for row in store.query(" UNION ALL ".join(parts), params * len(parts)):
        out[row[0]].append({"value": _name(row[1]), **_sums(row[2:7])})
    for items in out.values():
        items.sort(key=lambda x: (-x["prompt_tokens"], -x["requests"], x["value"]))
    return out


# -- distribution -----------------------------------------------------------------------


def bin_width(max_tokens: int, bins: int = 60) -> int:
    """A power-of-two multiple of 64 tokens (block-aligned) giving at most ``bins`` bins."""
    width = 64
    while max_tokens / width > bins:
        width *= 2
    return width


def distribution(store: Store, scope: Scope, by: str, max_slices: int = MAX_GROUPS) -> dict:
    """Per slice of ``by``: the cached-token and prompt-token histograms (counted in the
    database) and the doctor's verdict on a pinned constant."""
    column = DIMENSIONS[by]
    where, params = scope.where()
    rows = store.query(
        f"SELECT {column}, COUNT(*), SUM(prompt_tokens), SUM(COALESCE(cached_tokens, 0)),"
        f" MAX(prompt_tokens) FROM requests WHERE {OK}{where} GROUP BY 1",
        params,
    )
    rows.sort(key=lambda r: (-as_int(r[1]), _name(r[0])))
    top = rows[:max_slices]
    out: dict[str, Any] = {"by": by, "width": None, "block": None, "slices": []}
    if not top:
        return out
    width = bin_width(max(as_int(r[4]) for r in top))
    out["width"] = width
    hist: dict[str, dict[str, dict[int, int]]] = defaultdict(lambda: {"cached": {}, "prompt": {}})
    for kind, expr in (("cached", "COALESCE(cached_tokens, 0)"), ("prompt", "prompt_tokens")):
        for value, b, n in store.query(
            f"SELECT {column}, {expr} / CAST(? AS BIGINT), COUNT(*) FROM requests"
            f" WHERE {OK}{where} GROUP BY 1, 2",
            [width, *params],
        ):
            hist[_name(value)][kind][as_int(b)] = as_int(n)
    block = dist_mod.infer_block(
        dist_mod.cached_values(store, scope.pairs(), scope.since, scope.until)
    )
    out["block"] = asdict(block) if block else None
    for value, n, prompt, cached, max_prompt in top:
        narrowed = scope.pairs() + [(column, value)]
        groups = dist_mod.load(store, narrowed, scope.since, scope.until)
        dist = dist_mod.analyse(groups, block.block if block else None)
        h = hist[_name(value)]
        n_bins = max([*h["cached"], *h["prompt"], 0]) + 1
        out["slices"].append(
            {
                "value": _name(value),
                "filter": {"column": column, "value": value},
                "requests": as_int(n),
                "prompt_tokens": as_int(prompt),
                "cached_tokens": as_int(cached),
                "hit_rate": _rate(as_int(prompt), as_int(cached)),
                "max_prompt": as_int(max_prompt),
                "cached_bins": [h["cached"].get(b, 0) for b in range(n_bins)],
                "prompt_bins": [h["prompt"].get(b, 0) for b in range(n_bins)],
                "zero": next((g.requests for g in groups if g.cached == 0), 0),
                "modes": dist.modes,
                "pinned": asdict(dist.pinned) if dist.pinned else None,
                "pinned_expression": dist.pinned.expression if dist.pinned else None,
            }
        )
    return out


# -- upstream ---------------------------------------------------------------------------


def upstream_stats(store: Store, scope: Scope, error_rows: int = 30) -> dict[str, Any]:
    """Per (channel, replica): requests, errors, hit rate, TTFT; and the recent errors."""
    where, params = scope.where()
    rows = store.query(
        f"SELECT channel, replica, {_SUMS}, MAX(received_at),"
        f" MAX(CASE WHEN {ERROR} THEN received_at END), SUM(retries)"
        f" FROM requests WHERE 1 = 1{where} GROUP BY 1, 2",
        params,
    )
    ttft = percentiles(store, scope, ["channel", "replica"])
    replicas = []
    for r in rows:
        replicas.append(
            {
                "channel": r[0],
                "replica": r[1],
                **_sums(r[2:7]),
                "last_seen": _f(r[7]),
                "last_error": _f(r[8]),
                "retries": as_int(r[9]),
                "ttft": ttft.get((r[0], r[1])),
            }
        )
    errors = [
        {
            "channel": ch,
            "replica": rep,
            "status": as_int(status),
            "error_type": etype,
            "requests": as_int(n),
            "last": _f(at),
        }
        for ch, rep, status, etype, n, at in store.query(
            "SELECT channel, replica, status, error_type, COUNT(*), MAX(received_at)"
            f" FROM requests WHERE {ERROR}{where} GROUP BY 1, 2, 3, 4"
            f" ORDER BY 5 DESC, 6 DESC LIMIT {int(error_rows)}",
            params,
        )
    ]
    return {"replicas": replicas, "errors": errors}


# -- request log ------------------------------------------------------------------------

LOG_COLUMNS = (
    "request_id",
    "received_at",
    "endpoint",
    "client",
    "client_version",
    "key_name",
    "session_id",
    "session_kind",
    "requested_model",
    "upstream_model",
    "channel",
    "replica",
    "stream",
    "status",
    "error_type",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "ttft_ms",
    "latency_ms",
    "retries",
    "captured",
)
DETAIL_COLUMNS = (
    *LOG_COLUMNS,
    "first_byte_at",
    "done_at",
    "key_owner",
    "reported_input_tokens",
    "reported_cache_read_tokens",
    "reported_output_tokens",
    "error_message",
)


def _row_dict(columns: tuple[str, ...], row: tuple) -> dict[str, Any]:
    out = dict(zip(columns, row, strict=True))
    for k in ("stream", "captured"):
        if k in out:
            out[k] = bool(out[k])
    for k, v in out.items():
        if v is not None and not isinstance(v, bool | str | int | float):
            out[k] = float(v)  # Postgres numeric
    out["hit_rate"] = (
        (out.get("cached_tokens") or 0) / out["prompt_tokens"] if out.get("prompt_tokens") else None
    )
    return out


def request_log(
    store: Store, scope: Scope, *, limit: int = 100, before: str | None = None
) -> dict[str, Any]:
    """The newest requests first, ``limit`` at a time; ``before`` is the cursor the
    previous page returned."""
    where, params = scope.where()
    if before:
        try:
            at_s, id_s = before.split(":", 1)
            at, rid = float(at_s), int(id_s)
        except ValueError:
            raise BadParam("before must be the cursor a previous page returned") from None
        where += " AND (received_at < ? OR (received_at = ? AND id < ?))"
        params = [*params, at, at, rid]
    limit = max(1, min(int(limit), 500))
    rows = store.query(
        f"SELECT id, {', '.join(LOG_COLUMNS)} FROM requests WHERE 1 = 1{where}"
        f" ORDER BY received_at DESC, id DESC LIMIT {limit + 1}",
        params,
    )
    page = rows[:limit]
    cursor = f"{page[-1][2]!r}:{page[-1][0]}" if len(rows) > limit else None
    return {"rows": [_row_dict(LOG_COLUMNS, r[1:]) for r in page], "next": cursor}


def _segs(store: Store, row: tuple) -> tuple[list, list]:
    [(seg_in, seg_out)] = lists.whole(store, [row[: lists.WIDTH]])
    return seg_in or [], list(seg_out or [])


def _seg_list(segs: list) -> list[dict[str, Any]]:
    return [
        {"kind": s.kind, "name": s.name, "hash": s.hash, "chars": s.chars, "tokens": s.tokens}
        for s in segs
    ]


def _change(prev: list | None, cur: list) -> dict[str, Any] | None:
    if prev is None:
        return None
    fc = first_changed(prev, cur)
    if fc is None:
        return {"index": None, "offset": None, "prev_len": len(prev), "prev_hash": None}
    return {
        "index": fc.index,
        "offset": fc.offset,
        "prev_len": len(prev),
        "prev_hash": prev[fc.index].hash if fc.index < len(prev) else None,
    }


def request_detail(store: Store, request_id: str) -> dict[str, Any] | None:
    """One request with its segments, its neighbours in the session, and where its prompt
    first differs from the previous request's (as received and as sent upstream)."""
    rows = store.query(
        f"SELECT id, {', '.join(DETAIL_COLUMNS)}, {lists.SELECT}, CAST(change AS TEXT)"
        " FROM requests WHERE request_id = ?",
        [request_id],
    )
    if not rows:
        return None
    row = rows[0]
    rid, n = row[0], len(DETAIL_COLUMNS)
    out = _row_dict(DETAIL_COLUMNS, row[1 : n + 1])
    seg_in, seg_out = _segs(store, row[n + 1 :])
    out["segments_in"] = _seg_list(seg_in)
    out["segments_out"] = _seg_list(seg_out)
    out["segments_same"] = seg_in == seg_out
    change = decode_change(row[n + 1 + lists.WIDTH])
    out["change"] = msgspec.to_builtins(change) if change is not None else None
    out["previous"] = out["next"] = None
    out["changed_in"] = out["changed_out"] = None
    session, at = out["session_id"], out["received_at"]
    if session is not None:
        prev = store.query(
            f"SELECT request_id, received_at, cached_tokens, {lists.SELECT} FROM requests"
            " WHERE session_id = ? AND (received_at < ? OR (received_at = ? AND id < ?))"
            " ORDER BY received_at DESC, id DESC LIMIT 1",
            [session, at, at, rid],
        )
        nxt = store.query(
            "SELECT request_id FROM requests"
            " WHERE session_id = ? AND (received_at > ? OR (received_at = ? AND id > ?))"
            " ORDER BY received_at, id LIMIT 1",
            [session, at, at, rid],
        )
        [(position,)] = store.query(
            "SELECT COUNT(*) FROM requests"
            " WHERE session_id = ? AND (received_at < ? OR (received_at = ? AND id <= ?))",
            [session, at, at, rid],
        )
        out["session_position"] = as_int(position)
        if prev:
            p = prev[0]
            p_in, p_out = _segs(store, p[3:])
            out["previous"] = {
                "request_id": p[0],
                "received_at": _f(p[1]),
                "cached_tokens": p[2],
            }
            if p_in or seg_in:
                out["changed_in"] = _change(p_in, seg_in)
            if p_out or seg_out:
                out["changed_out"] = _change(p_out, seg_out)
        if nxt:
            out["next"] = nxt[0][0]
    return out
