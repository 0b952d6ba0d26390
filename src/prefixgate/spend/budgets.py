"""The windows budgets count in and whose budget lines apply.

A budget line (``2M tokens/day``, ``50 USD/month``) is parsed where the config is,
``config/spend.py`` (:func:`parse_budget`, re-exported here); a key's budgets and its
owner's budgets all apply: a request must fit each.
"""

from __future__ import annotations

import datetime as dt

from prefixgate.config.spend import PERIODS, TOKENS, Budget, BudgetSyntaxError, parse_budget


def owner_lines(
    config_owners: dict[str, tuple[str, ...]], console_owners: dict[str, tuple[str, ...]]
) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each owner's budget lines and where they come from (``"console"`` or
    ``"config"``): an owner the console gave budgets has those, in place of the config's
    ``budgets.owners`` entry; the others keep the config's."""
    out = {o: ("config", tuple(lines)) for o, lines in config_owners.items()}
    out.update({o: ("console", tuple(lines)) for o, lines in console_owners.items()})
    return out


def window(period: str, now: float) -> tuple[float, float]:
    """The calendar window (UTC) holding ``now``: its start and end, epoch seconds."""
    t = dt.datetime.fromtimestamp(now, dt.UTC)
    start = t.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        end = start + dt.timedelta(days=1)
    elif period == "week":
        start -= dt.timedelta(days=start.weekday())
        end = start + dt.timedelta(days=7)
    elif period == "month":
        start = start.replace(day=1)
        end = (start + dt.timedelta(days=32)).replace(day=1)
    else:
        raise ValueError(f"unknown period {period!r}")
    return start.timestamp(), end.timestamp()


def window_label(period: str, start: float) -> str:
    """A window's name in counter keys: its first day, ``2025-06-01``."""
    return dt.datetime.fromtimestamp(start, dt.UTC).strftime("%Y-%m-%d")


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


__all__ = [
    "PERIODS",
    "TOKENS",
    "Budget",
    "BudgetSyntaxError",
    "iso",
    "owner_lines",
    "parse_budget",
    "window",
    "window_label",
]
