"""A key holder's own view: their usage, what is left of their budgets, their hit rate,
their sessions, the prefix breaks found in them and the doctor's findings about their
requests (:mod:`prefixgate.doctor.holder`), for the key they signed in with and never
another's (``/dashboard/me`` and ``/dashboard/api/me`` with a key holder's
session; ``GET /v1/me`` with the key itself, for scripts).

Every query is bound to the caller's key name, taken from the key they presented (or the
session it opened); nothing in the URL chooses whose records are read."""

from __future__ import annotations

import time

from prefixgate.spend.prices import fmt_money

DEFAULT_DAYS = 7.0

_TOTALS = (
    "SELECT COUNT(*), SUM(COALESCE(prompt_tokens, 0)), SUM(COALESCE(cached_tokens, 0)),"
    " SUM(COALESCE(completion_tokens, 0)), SUM(COALESCE(cost_nano, 0)),"
    " SUM(CASE WHEN status >= 400 THEN 1 ELSE 0 END)"
    " FROM requests WHERE key_name = ? AND received_at >= ?"
)
_SESSIONS = (
    "SELECT session_id, COUNT(*), SUM(COALESCE(prompt_tokens, 0)),"
    " SUM(COALESCE(cached_tokens, 0)), MIN(received_at), MAX(received_at),"
    " SUM(CASE WHEN change_class IS NOT NULL THEN 1 ELSE 0 END)"
    " FROM requests WHERE key_name = ? AND received_at >= ? AND session_id IS NOT NULL"
    " GROUP BY session_id ORDER BY MAX(received_at) DESC LIMIT 50"
)
_BREAKS = (
    "SELECT session_id, change_class, change_segment, COUNT(*), SUM(COALESCE(change_lost, 0))"
    " FROM requests WHERE key_name = ? AND received_at >= ? AND change_class IS NOT NULL"
    " GROUP BY session_id, change_class, change_segment"
    " ORDER BY SUM(COALESCE(change_lost, 0)) DESC LIMIT 20"
)


def days_of(value: str | None) -> float:
    """``?days=N`` (an hour to 366 days), the last week by default."""
    try:
        days = float(value) if value else DEFAULT_DAYS
    except ValueError:
        days = DEFAULT_DAYS
    return min(max(days, 1 / 24), 366.0) if days == days else DEFAULT_DAYS  # NaN: default


def view(store, principal, *, since: float, budgets: dict, currency: str, shared=None) -> dict:
    """The holder's figures since ``since``; ``budgets``: (scope, name) -> parsed budgets
    of the key and its owner."""
    from prefixgate.spend.standing import standing

    name = principal.name
    [(n, prompt, cached, output, nanos, failed)] = store.query(_TOTALS, [name, since])
    prompt, cached = int(prompt or 0), int(cached or 0)
    left = standing(store, budgets, currency, time.time(), shared)

    def budget_view(who) -> list[dict]:
        return [
            {
                "budget": b.text,
                "used": fmt_money(u, 6) if b.money else u,
                "left": fmt_money(lf, 6) if b.money else lf,
            }
            for b, u, lf in left.get(who, ())
        ]

    sessions = [
        {
            "session": sid,
            "requests": int(count),
            "prompt_tokens": int(p or 0),
            "hit_rate": (int(c or 0) / int(p)) if p else None,
            "first_at": first,
            "last_at": last,
            "prefix_breaks": int(breaks or 0),
        }
        for sid, count, p, c, first, last, breaks in store.query(_SESSIONS, [name, since])
    ]
    breaks = [
        {
            "session": sid,
            "change": kind,
            "segment": segment,
            "requests": int(count),
            "tokens_lost": int(lost or 0),
        }
        for sid, kind, segment, count, lost in store.query(_BREAKS, [name, since])
    ]
    return {
        "key": name,
        "owner": principal.owner,
        "since": since,
        "requests": int(n or 0),
        "failed": int(failed or 0),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": int(output or 0),
        "hit_rate": cached / prompt if prompt else None,
        "cost": fmt_money(int(nanos or 0), 6) if nanos else None,
        "currency": currency,
        "budgets": budget_view(("key", name)),
        "owner_budgets": budget_view(("owner", principal.owner)) if principal.owner else [],
        "sessions": sessions,
        "prefix_breaks": breaks,
    }


class HolderFindings:
    """The doctor's findings about one key's records (every kind the records make; none
    from the upstreams' metrics, which are the admin's). A diagnosis is kept ``ttl``
    seconds while the key's count of records in the window stays the same (a page
    reloaded, a script polling ``/v1/me``, runs it once), for at most ``size`` keys."""

    def __init__(self, dsn: str, ttl: float = 30.0, size: int = 256) -> None:
        self.dsn, self.ttl, self.size = dsn, ttl, size
        self._kept: dict[tuple[str, float], tuple[float, int, list[dict]]] = {}

    def of(self, key_name: str, days: float, records: int, policies: dict[str, str]) -> list:
        """The findings about ``key_name``'s ``records`` records of the last ``days`` days."""
        from dataclasses import asdict

        from prefixgate.doctor import diagnose

        now = time.monotonic()
        hit = self._kept.get((key_name, days))
        if hit is not None and hit[0] > now and hit[1] == records:
            return hit[2]
        since = time.time() - days * 86400.0
        d = diagnose(self.dsn, since=since, policies=policies, key=key_name)
        out = [asdict(f) for f in d.findings if f.kind not in QUIET]
        if len(self._kept) >= self.size:
            self._kept.pop(next(iter(self._kept)))
        self._kept[(key_name, days)] = (now + self.ttl, records, out)
        return out


# Findings that say nothing is wrong or describe the predictors, not the holder's requests.
QUIET = {"no_problem", "calibration"}


__all__ = ["QUIET", "HolderFindings", "days_of", "view"]
