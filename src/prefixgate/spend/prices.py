"""Prices and what a request cost.

A price is given per million tokens for fresh input, cached input (a prefix-cache hit),
cache writes (where an upstream reports them, as Anthropic's API does) and output. A
request's cost comes from the raw upstream usage on its record: ``prompt_tokens`` counts
every input token, so the fresh ones are ``prompt - cached - cache_creation``. The cost
the cache saved is what the cached tokens would have cost as fresh input, less what they
cost cached.

Arithmetic is exact: a price is held as micro-units per million tokens (an integer), a
cost is computed in pico-units and rounded once, half up, to nanos (billionths of the
currency). Each record carries that integer; budgets add the same integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from prefixgate.config.spend import NANOS


def micros(price: float | int | str | Decimal) -> int:
    """A price per million tokens as integer micro-units (6 decimals kept)."""
    return int((Decimal(str(price)) * 1_000_000).to_integral_value(ROUND_HALF_UP))


@dataclass(frozen=True, slots=True)
class Price:
    """One model's (or channel's) price, in micro-units of the currency per million
    tokens."""

    input: int
    cached_input: int
    output: int
    cache_write: int

    @classmethod
    def of(cls, input, cached_input, output, cache_write=None) -> Price:
        return cls(
            micros(input),
            micros(cached_input),
            micros(output),
            micros(input if cache_write is None else cache_write),
        )

    def cost(self, fresh: int, cached: int, created: int, output: int) -> int:
        """Nanos for these token counts."""
        pico = (
            fresh * self.input
            + cached * self.cached_input
            + created * self.cache_write
            + output * self.output
        )
        return (pico + 500) // 1000

    def saved(self, cached: int) -> int:
        """Nanos the cached tokens saved against fresh input (never below zero)."""
        return max(0, (cached * (self.input - self.cached_input) + 500) // 1000)


@dataclass(frozen=True, slots=True)
class Cost:
    nanos: int
    saved_nanos: int


class PriceTable:
    """Prices by channel (what a channel charges for any model it serves) and by the model
    the client asked for; a channel's price wins for the requests it served."""

    def __init__(self, currency: str, models: dict[str, Price], channels: dict[str, Price]) -> None:
        self.currency = currency
        self.models = models
        self.channels = channels

    @classmethod
    def from_config(cls, cfg) -> PriceTable:
        def table(entries) -> dict[str, Price]:
            return {
                name: Price.of(p.input, p.cached_input, p.output, p.cache_write)
                for name, p in entries.items()
            }

        return cls(cfg.currency, table(cfg.models), table(cfg.channels))

    def price(self, model: str | None, channel: str | None) -> Price | None:
        if channel is not None:
            p = self.channels.get(channel)
            if p is not None:
                return p
        return self.models.get(model) if model is not None else None

    def cost(
        self,
        model: str | None,
        channel: str | None,
        prompt: int | None,
        cached: int | None,
        created: int | None,
        output: int | None,
    ) -> Cost | None:
        """The cost of one request's raw upstream usage; None when it has no price or the
        upstream reported no usage."""
        if prompt is None and output is None:
            return None
        p = self.price(model, channel)
        if p is None:
            return None
        cached, created = cached or 0, created or 0
        fresh = max(0, (prompt or 0) - cached - created)
        return Cost(p.cost(fresh, cached, created, output or 0), p.saved(cached))

    def charge(self, rec) -> None:
        """Put the record's cost on it (``cost_nano``, ``cost_saved_nano``)."""
        c = self.cost(
            rec.requested_model,
            rec.channel,
            rec.prompt_tokens,
            rec.cached_tokens,
            rec.cache_creation_tokens,
            rec.completion_tokens,
        )
        if c is not None:
            rec.cost_nano, rec.cost_saved_nano = c.nanos, c.saved_nanos

    def estimate_price(self, model: str, channels: list[str]) -> Price | None:
        """The price to estimate a request with before it is routed: the model's, else
        the dearest of the channels that may serve it."""
        p = self.models.get(model)
        if p is not None:
            return p
        found = [self.channels[c] for c in channels if c in self.channels]
        return max(found, key=lambda q: (q.input, q.output)) if found else None


def money(nanos: int | None) -> float | None:
    """Nanos as a float amount of the currency, for reports and metrics."""
    return None if nanos is None else nanos / NANOS


def fmt_money(nanos: int | None, places: int = 6) -> str:
    """Nanos as a decimal string, exact to ``places`` (reports, headers)."""
    if nanos is None:
        return "-"
    q = Decimal(nanos) / NANOS
    return f"{q:.{places}f}"


__all__ = ["NANOS", "Cost", "Price", "PriceTable", "fmt_money", "micros", "money"]
