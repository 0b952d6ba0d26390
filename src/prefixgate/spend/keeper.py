"""The budget keeper: which budgets a request must fit, the hold it takes before it goes
upstream (the ``budget`` step), and the settlement with its real usage when its record
closes (``Exchange.finish``).

A request's estimate is its prompt at about four bytes a token, all of it fresh, plus
``budgets.output_estimate`` output tokens (its ``max_tokens`` when lower); in money, that
priced at the model's price. The settlement charges the record's own figures: tokens are
``prompt_tokens + completion_tokens``, money is ``cost_nano`` (a request that reported no
usage is charged nothing). Settling runs off the request path, after the answer's last
byte. If the budget counters cannot be reached the request goes on without a hold (budgets are
kept again once it is back) and the log says so, once per interval.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from prefixgate.errors import BudgetExceeded, RateLimited
from prefixgate.logthrottle import LogThrottle
from prefixgate.spend.budgets import Budget, iso, parse_budget, window, window_label
from prefixgate.spend.counters import Line, Refused, make_counters
from prefixgate.spend.prices import PriceTable, fmt_money

log = logging.getLogger("prefixgate")
KEEP_AFTER_WINDOW = 7 * 86400  # seconds a counter outlives its window
BYTES_PER_TOKEN = 4
APPLIED_CACHE = 4096  # principals whose budgets' counters are kept


@dataclass(frozen=True, slots=True)
class Applied:
    """One budget as it applies to a request: whose it is and where it is counted."""

    scope: str  # "key" | "owner"
    name: str
    budget: Budget
    counter: str
    end: float  # the window's end


@dataclass(slots=True)
class Hold:
    """What a request holds until it is settled."""

    id: str
    applied: list[Applied]


def counter_name(scope: str, name: str, budget: Budget, start: float) -> str:
    return f"{scope}:{name}:{budget.unit}:{budget.period}:{window_label(budget.period, start)}"


class BudgetKeeper:
    def __init__(self, config, prices: PriceTable | None, counters=None) -> None:
        self.currency = prices.currency if prices is not None else "USD"
        self.prices = prices
        self.owners = {
            owner: tuple(parse_budget(b, self.currency) for b in lines)
            for owner, lines in config.budgets.owners.items()
        }
        self.output_estimate = config.budgets.output_estimate
        self.hold_seconds = config.budgets.hold_seconds
        self.counters = counters if counters is not None else make_counters(config.budgets_shared)
        self.shared = config.budgets_shared is not None
        self._channels = {c.name: c for c in config.channels}
        self._windows: dict[str, tuple[float, float]] = {}
        self._applied: dict[tuple, tuple[float, list[Applied]]] = {}  # see applied()
        self._tasks: set[asyncio.Task] = set()
        self.failures = LogThrottle(log, interval=30.0)

    # -- which budgets ---------------------------------------------------------------------
    def _window(self, period: str, now: float) -> tuple[float, float]:
        w = self._windows.get(period)
        if w is None or not (w[0] <= now < w[1]):
            w = self._windows[period] = window(period, now)
        return w

    def applied(self, principal, now: float) -> list[Applied]:
        """The budgets ``principal`` must fit at ``now`` (its owner's: those the console
        gave the owner when it did, else the config's); kept per principal until the first
        of their windows ends (a counter's name is built once a window, not per request)."""
        owner = principal.owner
        owners = principal.owner_budgets  # the console's, in place of the config's
        key = (principal.name, principal.budgets, owner, owners)
        hit = self._applied.get(key)
        if hit is not None and now < hit[0]:
            return hit[1]
        if owners is None:
            owners = self.owners.get(owner, ()) if owner else ()
        out = []
        for scope, name, budgets in (
            ("key", principal.name, principal.budgets),
            ("owner", owner, owners),
        ):
            for b in budgets:
                start, end = self._window(b.period, now)
                out.append(Applied(scope, name, b, counter_name(scope, name, b, start), end))
        if len(self._applied) >= APPLIED_CACHE:
            self._applied.clear()
        self._applied[key] = (min((a.end for a in out), default=now + 60.0), out)
        return out

    # -- before the upstream -----------------------------------------------------------------
    def estimate(self, raw_len: int, body, model: str) -> tuple[int, int]:
        """(tokens, nanos) a request is held for before it runs."""
        prompt = raw_len // BYTES_PER_TOKEN
        want = (
            body.get("max_completion_tokens")
            or body.get("max_tokens")
            or body.get("max_output_tokens")  # a Responses request's
        )
        out = self.output_estimate
        if isinstance(want, int) and not isinstance(want, bool) and 0 < want < out:
            out = want
        nanos = 0
        if self.prices is not None:
            serving = [c for c, ch in self._channels.items() if ch.serves(model)]
            price = self.prices.estimate_price(model, serving)
            if price is not None:
                nanos = price.cost(prompt, 0, 0, out)
        return prompt + out, nanos

    async def reserve(self, request_id: str, principal, raw_len: int, body, model: str):
        """Hold the request's estimate on each budget that applies; the hold and the
        headers that say what is left, or raise (429) when a budget has no room."""
        now = time.time()
        applied = self.applied(principal, now)
        if not applied:
            return None, {}
        tokens, nanos = self.estimate(raw_len, body, model)
        lines = [
            Line(
                a.counter,
                a.budget.amount,
                nanos if a.budget.money else tokens,
                int(a.end - now) + KEEP_AFTER_WINDOW,
            )
            for a in applied
        ]
        try:
            figures = await self.counters.reserve(request_id, lines, now, now + self.hold_seconds)
        except Refused as r:
            raise self._refusal(applied[r.index], r.spent, r.reserved, now) from None
        except Exception as exc:  # the counters are down: go on, said once per interval
            self.failures.warning(
                "reserve", "budgets not enforced: budget counters unreachable: %s", exc
            )
            return None, {}
        return Hold(request_id, applied), self.headers(applied, figures)

    def _refusal(self, a: Applied, spent: int, reserved: int, now: float):
        b = a.budget
        if spent >= b.amount:
            return BudgetExceeded(
                f"budget exceeded: {a.scope} {a.name!r} has used {self._amount(b, spent)} of "
                f"its budget of {b.text}; it renews at {iso(a.end)}",
                retry_after=max(1.0, a.end - now),
            )
        return RateLimited(
            f"the budget of {b.text} of {a.scope} {a.name!r} is held by requests in flight "
            f"({self._amount(b, spent)} used, {self._amount(b, reserved)} held): retry shortly",
            retry_after=1,
        )

    def _amount(self, b: Budget, units: int) -> str:
        return f"{fmt_money(units, 6)} {b.unit}" if b.money else f"{units} tokens"

    def headers(self, applied: list[Applied], figures: list[tuple[int, int]]) -> dict[str, str]:
        """``x-budget-remaining-tokens`` and ``x-budget-remaining-<currency>``: the least
        left of the budgets of each unit (after this request's hold)."""
        least: dict[str, int] = {}
        for a, (spent, reserved) in zip(applied, figures, strict=True):
            left = max(0, a.budget.amount - spent - reserved)
            unit = a.budget.unit
            least[unit] = min(least.get(unit, left), left)
        return {
            f"x-budget-remaining-{unit.lower()}": (str(v) if unit == "tokens" else fmt_money(v, 6))
            for unit, v in least.items()
        }

    # -- after the answer ---------------------------------------------------------------------
    def settle(self, hold: Hold, rec) -> None:
        """Settle ``hold`` with the record's real charge: in memory at once, in Redis in a
        task off the request path."""
        tokens = (rec.prompt_tokens or 0) + (rec.completion_tokens or 0)
        nanos = rec.cost_nano or 0
        charges = [nanos if a.budget.money else tokens for a in hold.applied]
        counters = [a.counter for a in hold.applied]
        at_once = getattr(self.counters, "settle_now", None)
        if at_once is not None:  # in memory: a few additions, no task
            at_once(hold.id, counters, charges)
            return
        task = asyncio.get_running_loop().create_task(self._settle(counters, hold.id, charges))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, counters: list[str], hold: str, charges: list[int]) -> None:
        try:
            await self.counters.settle(hold, counters, charges)
        except Exception as exc:
            self.failures.warning(
                "settle", "a budget charge was lost: budget counters unreachable: %s", exc
            )

    async def aclose(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
        await self.counters.aclose()


__all__ = ["Applied", "BudgetKeeper", "Hold", "counter_name"]
