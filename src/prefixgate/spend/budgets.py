"""Budgets as written in the config and the windows they count in.

A budget is one line, ``<amount> <unit>/<period>``: ``2M tokens/day``, ``50 USD/month``,
``1.5k tokens/week``. The unit is ``tokens`` (prompt and completion tokens, cached ones
included, as the upstream counts them) or the price table's currency (the requests'
cost). The period is a calendar ``day``, ``week`` (from Monday) or ``month``, in UTC. A
key's budgets and its owner's budgets all apply: a request must fit each.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from prefixgate.spend.prices import NANOS

PERIODS = ("day", "week", "month")
TOKENS = "tokens"
_SUFFIX = {"": 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}
_LINE = re.compile(r"^\s*([0-9][0-9_.,]*)\s*([kKmMgG]?)\s+([A-Za-z$]+)\s*/\s*([A-Za-z]+)\s*$")


class BudgetSyntaxError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Budget:
    """``amount`` is in tokens, or in nanos of the currency for a money budget."""

    amount: int
    unit: str  # "tokens" or the currency code
    period: str  # day | week | month
    text: str  # as written, for messages

    @property
    def money(self) -> bool:
        return self.unit != TOKENS


def parse_budget(text: str, currency: str = "USD") -> Budget:
    """One budget line; :class:`BudgetSyntaxError` says what is wrong with it."""
    if not isinstance(text, str):
        raise BudgetSyntaxError(f"budget {text!r}: write it as '<amount> <unit>/<period>'")
    m = _LINE.match(text)
    if m is None:
        raise BudgetSyntaxError(
            f"budget {text!r}: write it as '<amount> <unit>/<period>', e.g. "
            f"'2M tokens/day' or '50 {currency}/month'"
        )
    number, suffix, unit, period = m.groups()
    try:
        value = Decimal(number.replace("_", "").replace(",", "")) * _SUFFIX[suffix.lower()]
    except InvalidOperation:
        raise BudgetSyntaxError(f"budget {text!r}: {number!r} is not a number") from None
    if unit.lower() in (TOKENS, "token"):
        unit, amount = TOKENS, int(value)
    elif unit.upper() == currency.upper():
        unit, amount = currency, int(value * NANOS)
    else:
        raise BudgetSyntaxError(
            f"budget {text!r}: unknown unit {unit!r} (want 'tokens' or {currency!r}, the "
            "price table's currency)"
        )
    period = period.lower()
    if period not in PERIODS:
        raise BudgetSyntaxError(
            f"budget {text!r}: unknown period {period!r} (want {', '.join(PERIODS)})"
        )
    if amount <= 0:
        raise BudgetSyntaxError(f"budget {text!r}: the amount must be above zero")
    return Budget(amount, unit, period, text.strip())


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
