"""Prices and budgets as written in the config, and the checks that make a wrong one an
error at start rather than a surprise on a bill.

A budget is one line, ``<amount> <unit>/<period>``: ``2M tokens/day``, ``50 USD/month``,
``1.5k tokens/week``. The unit is ``tokens`` (prompt and completion tokens, cached ones
included, as the upstream counts them) or the price table's currency (the requests'
cost). The period is a calendar ``day``, ``week`` (from Monday) or ``month``, in UTC. A
key's budgets and its owner's budgets all apply: a request must fit each. How they are
counted is ``spend/``'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from pydantic import Field

from prefixgate.config.common import Model, RedisUrl

if TYPE_CHECKING:
    from prefixgate.config.root import Config

NANOS = 1_000_000_000  # nanos per unit of the currency

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


class PriceConfig(Model):
    """One price, in the table's currency per million tokens. ``cache_write`` (tokens an
    upstream reports written to its cache, as Anthropic's API does) costs ``input`` when
    not given."""

    input: float = Field(ge=0)
    cached_input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_write: float | None = Field(default=None, ge=0)


class PricesConfig(Model):
    """Prices by the model the client asked for, and by channel (a channel's price covers
    every model it serves and wins over the model's). A request without a price has no
    cost (spend/prices.py)."""

    currency: str = Field(default="USD", pattern=r"^[A-Za-z]{2,8}$")
    models: dict[str, PriceConfig] = Field(default_factory=dict)
    channels: dict[str, PriceConfig] = Field(default_factory=dict)


class BudgetsConfig(Model):
    """Budgets per owner (keys carry their own, ``keys[].budgets``) and how they are kept:
    ``shared`` (redis://…) shares them between gateways, as ``rate_limits_shared`` does
    (the default); without either each gateway keeps its own. A request is charged
    ``output_estimate`` output tokens (or its ``max_tokens``, when lower) before it goes
    upstream; a hold a gateway never settled (it died) lapses after ``hold_seconds``."""

    owners: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    shared: RedisUrl | None = None
    output_estimate: int = Field(default=1024, ge=0)
    hold_seconds: float = Field(default=3600.0, gt=0)


def check_spend(config: Config) -> None:
    """Prices for models no channel serves or channels that do not exist, and budgets that
    do not parse, are errors at start, not surprises on a bill."""
    prices = config.prices
    if prices is not None:
        names = {c.name for c in config.channels}
        for ch in prices.channels:
            if ch not in names:
                raise ValueError(
                    f"prices.channels.{ch}: no such channel (channels: {', '.join(sorted(names))})"
                )
        for model in prices.models:
            if not any(c.serves(model) for c in config.channels):
                served = sorted({m for c in config.channels for m in (*c.models, *c.model_map)})
                raise ValueError(
                    f"prices.models.{model}: no channel serves model {model!r} "
                    f"(served: {', '.join(served)})"
                )
    currency = prices.currency if prices is not None else "USD"
    lines = [(f"keys[{k.name}].budgets", b) for k in config.keys for b in k.budgets]
    lines += [(f"budgets.owners.{o}", b) for o, bs in config.budgets.owners.items() for b in bs]
    for where, text in lines:
        try:
            budget = parse_budget(text, currency)
        except BudgetSyntaxError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if budget.money and prices is None:
            raise ValueError(f"{where}: budget {text!r} is money: it needs a price table (prices:)")
