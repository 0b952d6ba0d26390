"""The usage report: requests, tokens (fresh, cached, written, output), hit rate, cost, what
the cache saved and what misses with a known cause lost, grouped by key, owner, model,
client, channel or day. Every sum runs inside the database (portable SQL through
:meth:`Store.query`); ``prefixgate usage`` prints it, the dashboard's usage page shows it.

Cost and saved are the records' own (priced when they were served). "Lost" is priced here,
with the table given, from the captured requests (segment capture): for each request whose
prompt broke against its session's previous one where the doctor names a known cause
(:func:`prefixgate.doctor.segments.classify`: the billing header, a timestamp, reordered
tools, …; not ``unknown``), the previous prompt's tokens after the break that it sent
again fresh, at what they cost fresh less what they would have cost cached. Compactions
are left out: a restarted history is not a prefix the cache could have served.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field

from prefixgate.spend.prices import PriceTable, fmt_money

DIMENSIONS = {
    "key": "key_name",
    "owner": "key_owner",
    "model": "requested_model",
    "client": "client",
    "channel": "channel",
    "day": "(CAST(received_at AS BIGINT) / 86400)",
}
NONE = "(none)"

_SUMS = (
    "COUNT(*),"
    " SUM(CASE WHEN status < 200 OR status >= 300 THEN 1 ELSE 0 END),"
    " SUM(COALESCE(prompt_tokens, 0) - COALESCE(cached_tokens, 0)"
    " - COALESCE(cache_creation_tokens, 0)),"
    " SUM(COALESCE(cached_tokens, 0)),"
    " SUM(COALESCE(cache_creation_tokens, 0)),"
    " SUM(COALESCE(completion_tokens, 0)),"
    " SUM(cost_nano),"
    " SUM(COALESCE(cost_saved_nano, 0)),"
    " SUM(CASE WHEN cost_nano IS NULL AND prompt_tokens IS NOT NULL THEN 1 ELSE 0 END)"
)
LOST_SAMPLE = 50_000  # the latest captured requests of the window read to attribute misses
TEXTS_SAMPLE = 500  # breaks of unknown cause looked at again with their captured texts


@dataclass
class UsageRow:
    group: str
    requests: int = 0
    errors: int = 0
    fresh_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    cost_nano: int | None = None  # None: no request of the group had a price
    saved_nano: int = 0
    lost_nano: int | None = None  # None: the store has no cause for its misses
    unpriced: int = 0  # requests with usage and no price

    @property
    def input_tokens(self) -> int:
        return self.fresh_tokens + self.cached_tokens + self.cache_write_tokens

    @property
    def hit_rate(self) -> float | None:
        return self.cached_tokens / self.input_tokens if self.input_tokens else None

    def add(self, other: UsageRow) -> None:
        for name in ("requests", "errors", "fresh_tokens", "cached_tokens", "cache_write_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.output_tokens += other.output_tokens
        self.saved_nano += other.saved_nano
        self.unpriced += other.unpriced
        for name in ("cost_nano", "lost_nano"):
            a, b = getattr(self, name), getattr(other, name)
            setattr(self, name, b if a is None else a if b is None else a + b)

    def to_dict(self, currency: str) -> dict:
        d = asdict(self)
        d.update(
            input_tokens=self.input_tokens,
            hit_rate=self.hit_rate,
            cost=_amount(self.cost_nano),
            saved=_amount(self.saved_nano),
            lost=_amount(self.lost_nano),
            currency=currency,
        )
        return d


@dataclass
class UsageReport:
    by: str
    since: float | None
    until: float | None
    currency: str
    rows: list[UsageRow] = field(default_factory=list)
    total: UsageRow = field(default_factory=lambda: UsageRow("total"))
    causes_known: bool = False  # the store has the capture's comparison (lost is priced)

    def to_dict(self) -> dict:
        return {
            "by": self.by,
            "since": self.since,
            "until": self.until,
            "currency": self.currency,
            "causes_known": self.causes_known,
            "rows": [r.to_dict(self.currency) for r in self.rows],
            "total": self.total.to_dict(self.currency),
        }


def _amount(nanos: int | None) -> float | None:
    return None if nanos is None else nanos / 1e9


def _label(by: str, value) -> str:
    if value is None:
        return NONE
    if by == "day":
        from prefixgate.doctor.timespec import format_day

        return format_day(int(value))
    return str(value)


def usage_report(
    store,
    by: str,
    *,
    where: str = "",
    params: list | tuple = (),
    prices: PriceTable | None = None,
    since: float | None = None,
    until: float | None = None,
) -> UsageReport:
    """The report for one dimension. ``where`` is ``AND``-able SQL (``received_at >= ?``
    …) with its ``params``; ``prices`` prices what misses lost (without it, lost is
    left out)."""
    dim = DIMENSIONS.get(by)
    if dim is None:
        raise ValueError(f"cannot group by {by!r}: want one of {', '.join(DIMENSIONS)}")
    report = UsageReport(by, since, until, prices.currency if prices else "")
    rows: dict[str, UsageRow] = {}
    sql = f"SELECT {dim}, {_SUMS} FROM requests WHERE 1 = 1{where} GROUP BY 1"
    for value, n, err, fresh, cached, written, out, cost, saved, unpriced in store.query(
        sql, params
    ):
        row = UsageRow(
            _label(by, value),
            int(n or 0),
            int(err or 0),
            int(fresh or 0),
            int(cached or 0),
            int(written or 0),
            int(out or 0),
            None if cost is None else int(cost),
            int(saved or 0),
            None,
            int(unpriced or 0),
        )
        rows[row.group] = row
    if prices is not None:
        report.causes_known = _price_lost(store, by, dim, where, params, prices, rows, since, until)
        for row in rows.values() if report.causes_known else ():
            row.lost_nano = row.lost_nano or 0
    if by == "day":  # days in order
        report.rows = sorted(rows.values(), key=lambda r: r.group)
    else:
        report.rows = sorted(
            rows.values(), key=lambda r: (-(r.cost_nano or 0), -r.input_tokens, r.group)
        )
    for row in report.rows:
        report.total.add(row)
    return report


def _price_lost(store, by, dim, where, params, prices: PriceTable, rows, since, until) -> bool:
    """Price what misses with a known cause lost into ``rows``; False when the store has no
    captured requests in the window (no cause can be known)."""
    lost = lost_tokens(store, since, until)
    if lost is None:
        return False
    if lost:
        sql = (
            f"SELECT request_id, {dim}, requested_model, channel FROM requests"
            f" WHERE segments_in IS NOT NULL{where}"
        )
        for rid, value, model, channel in store.query(sql, params):
            tokens = lost.get(rid)
            row = rows.get(_label(by, value))
            price = prices.price(model, channel)
            if tokens and row is not None and price is not None:
                row.lost_nano = (row.lost_nano or 0) + price.saved(tokens)
    return True


def lost_tokens(store, since: float | None, until: float | None) -> dict[str, int] | None:
    """Per request id, the prompt tokens it sent fresh because its prompt broke against its
    session's previous one for a known cause: the previous prompt's tokens after the break,
    at most what the request had fresh. None when the window has no captured request."""
    from prefixgate.doctor import segments as seg

    reqs = seg.load(store, [], since, until, limit=LOST_SAMPLE)
    if not reqs:
        return None
    breaks = []
    for session in seg.sessions(reqs).values():
        for prev, cur in zip(session, session[1:], strict=False):
            brk = seg.classify(prev, cur, {}, same_session=True)
            if brk is not None:
                breaks.append([prev, cur, brk])
    # Breaks of unknown cause, again with their texts (a billing header is told by its text).
    unknown = [b for b in breaks if b[2].cause == seg.UNKNOWN][-TEXTS_SAMPLE:]
    if unknown:
        hashes = {h for _, _, b in unknown for h in (b.in_prev, b.in_cur) if h}
        texts = store.get_texts(hashes) if hashes else {}
        for b in unknown:
            b[2] = seg.classify(b[0], b[1], texts, same_session=True) or b[2]
    out: dict[str, int] = {}
    for prev, cur, brk in breaks:
        if brk.cause in (seg.UNKNOWN, seg.COMPACTION):
            continue
        resent = min(prev.prompt_tokens, cur.prompt_tokens) - brk.offset
        tokens = min(resent, cur.prompt_tokens - cur.cached_tokens)
        if tokens > 0:
            out[cur.request_id] = tokens
    return out


# -- presentation ------------------------------------------------------------------------
COLUMNS = (
    ("requests", "requests"),
    ("errors", "errors"),
    ("fresh_tokens", "fresh"),
    ("cached_tokens", "cached"),
    ("cache_write_tokens", "written"),
    ("output_tokens", "output"),
    ("hit_rate", "hit rate"),
    ("cost", "cost"),
    ("saved", "saved"),
    ("lost", "lost"),
)


def render_text(report: UsageReport) -> str:
    cur = report.currency
    head = [report.by, *(label for _, label in COLUMNS)]
    lines = [head]
    for r in [*report.rows, report.total]:
        lines.append(
            [
                r.group,
                str(r.requests),
                str(r.errors),
                f"{r.fresh_tokens:,}",
                f"{r.cached_tokens:,}",
                f"{r.cache_write_tokens:,}",
                f"{r.output_tokens:,}",
                "-" if r.hit_rate is None else f"{r.hit_rate:.1%}",
                fmt_money(r.cost_nano, 4),
                fmt_money(r.saved_nano, 4) if r.cost_nano is not None else "-",
                fmt_money(r.lost_nano, 4),
            ]
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = []
    for i, row in enumerate(lines):
        cells = [
            row[0].ljust(widths[0]),
            *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)),
        ]
        out.append("  ".join(cells).rstrip())
        if i == 0 or i == len(lines) - 2:
            out.append("  ".join("-" * w for w in widths))
    notes = []
    if cur:
        notes.append(f"money in {cur}")
    if report.total.unpriced:
        notes.append(f"{report.total.unpriced} requests had no price")
    if not report.causes_known:
        notes.append("lost: the store has no cause for its misses (or no prices were given)")
    if notes:
        out.append("(" + "; ".join(notes) + ")")
    return "\n".join(out)


def render_json(report: UsageReport) -> str:
    return json.dumps(report.to_dict(), indent=2)


def render_csv(report: UsageReport) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(
        [
            report.by,
            "requests",
            "errors",
            "fresh_tokens",
            "cached_tokens",
            "cache_write_tokens",
            "output_tokens",
            "hit_rate",
            f"cost_{report.currency or 'money'}",
            f"saved_{report.currency or 'money'}",
            f"lost_{report.currency or 'money'}",
        ]
    )
    for r in report.rows:
        w.writerow(
            [
                r.group,
                r.requests,
                r.errors,
                r.fresh_tokens,
                r.cached_tokens,
                r.cache_write_tokens,
                r.output_tokens,
                "" if r.hit_rate is None else f"{r.hit_rate:.6f}",
                "" if r.cost_nano is None else fmt_money(r.cost_nano, 9),
                "" if r.cost_nano is None else fmt_money(r.saved_nano, 9),
                "" if r.lost_nano is None else fmt_money(r.lost_nano, 9),
            ]
        )
    return buf.getvalue()


__all__ = [
    "DIMENSIONS",
    "UsageReport",
    "UsageRow",
    "render_csv",
    "render_json",
    "render_text",
    "usage_report",
]
