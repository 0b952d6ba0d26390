"""What a request runs on, from its first step to its record: one generation of the
configuration and the services built from it (the keys, the router, the prices, the
budgets), swapped whole by a reload (``reload.py``).

An exchange takes the generation current when it arrives and keeps it to its end, so a
request in flight finishes on the settings it started with; a retired generation is
closed (its router's health checks, its replicas' upstream connections that no newer
generation uses) once its last request is done."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prefixgate.auth import Authenticator
from prefixgate.events.tokens import EngineTokens
from prefixgate.routing.channels import ChannelRouter
from prefixgate.spend.keeper import BudgetKeeper
from prefixgate.spend.prices import PriceTable

if TYPE_CHECKING:
    from prefixgate.config import Config
    from prefixgate.engine.client import EngineClient
    from prefixgate.engine.order import RenderOrders
    from prefixgate.events.hub import EngineEvents


@dataclass(eq=False)
class Live:
    """One generation: the config and what is built from it. ``inflight``: the requests
    that run on it; ``retired``: a newer one took its place."""

    config: Config
    auth: Authenticator
    router: ChannelRouter
    engine_tokens: EngineTokens
    prices: PriceTable | None
    budgets: BudgetKeeper | None
    generation: int = 1
    loaded_at: float = field(default_factory=time.time)
    inflight: int = 0
    retired: bool = False

    @classmethod
    def build(
        cls,
        config: Config,
        *,
        upstream: EngineClient,
        events: EngineEvents | None,
        orders: RenderOrders,
        previous: Live | None = None,
    ) -> Live:
        """A generation for ``config``; after ``previous``, it keeps what must outlive a
        reload: the keys loaded from the store, what the budgets have counted, and the
        router's state of each replica that stays (health, in-flight counts, the prefix
        router's memory of what each replica holds). ``orders``: the gateway's, which
        outlives every generation (what each channel's template was learned to do)."""
        auth = Authenticator(config)
        tokens = EngineTokens(config.channels, orders=orders)
        router = ChannelRouter(
            config.channels, transport=upstream, events=events, tokens=tokens, orders=orders
        )
        prices = PriceTable.from_config(config.prices) if config.prices else None
        budgets = None
        if has_budgets(config):
            counters = previous.budgets.counters if previous and previous.budgets else None
            budgets = BudgetKeeper(config, prices, counters=counters)
        if previous is not None:
            auth.adopt(previous.auth)
            router.adopt(previous.router)
        generation = previous.generation + 1 if previous is not None else 1
        return cls(config, auth, router, tokens, prices, budgets, generation)


def has_budgets(config: Config) -> bool:
    """Budgets in the config, or keys in the store (which may carry their own)."""
    return bool(config.store_keys or config.budgets.owners or any(k.budgets for k in config.keys))
