"""What keys and owners have used of their budgets in the current windows, read from the
store's records (the truth once requests are settled) or from the shared counters (which also
knows the holds of requests in flight).

A gateway with budgets seeds its budget counters from the store at start, so a restart does not
renew anyone's budget; ``prefixgate keys list`` shows what is left.
"""

from __future__ import annotations

from prefixgate.spend.budgets import PERIODS, TOKENS, window, window_label

# Per key and owner: tokens and nanos since a time (the records' own charges).
_USED = (
    "SELECT key_name, key_owner,"
    " SUM(COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0)),"
    " SUM(COALESCE(cost_nano, 0))"
    " FROM requests WHERE received_at >= ? GROUP BY key_name, key_owner"
)


def used_since(store, since: float) -> dict[tuple[str, str], tuple[int, int]]:
    """(scope, name) -> (tokens, nanos) of the records received since ``since``."""
    out: dict[tuple[str, str], list[int]] = {}
    for key, owner, tokens, nanos in store.query(_USED, [since]):
        for scope, name in (("key", key), ("owner", owner)):
            if name is None:
                continue
            acc = out.setdefault((scope, name), [0, 0])
            acc[0] += int(tokens or 0)
            acc[1] += int(nanos or 0)
    return {k: (v[0], v[1]) for k, v in out.items()}


def seeds(store, currency: str, now: float) -> list[tuple[str, int, int]]:
    """(counter, spent, ttl) for every key and owner with usage in the current windows."""
    out = []
    for period in PERIODS:
        start, end = window(period, now)
        label = window_label(period, start)
        ttl = int(end - now) + 7 * 86400
        for (scope, name), (tokens, nanos) in used_since(store, start).items():
            for unit, spent in ((TOKENS, tokens), (currency, nanos)):
                if spent:
                    out.append((f"{scope}:{name}:{unit}:{period}:{label}", spent, ttl))
    return out


def standing(
    store,
    budgets: dict[tuple[str, str], tuple],
    currency: str,
    now: float,
    shared_url: str | None = None,
) -> dict[tuple[str, str], list[tuple]]:
    """For each (scope, name) -> its budgets: a list of (budget, used, left), used counting
    what requests in flight hold when the counters are shared (it is read from Redis), else
    the store's records of the window."""
    from prefixgate.spend.keeper import counter_name

    wanted = [
        (who, b, counter_name(*who, b, window(b.period, now)[0]))
        for who, bs in budgets.items()
        for b in bs
    ]
    if shared_url:
        import asyncio

        from prefixgate.spend.counters import RedisCounters

        async def read():
            counters = RedisCounters(shared_url)
            try:
                return await counters.read([c for _, _, c in wanted])
            finally:
                await counters.aclose()

        used = [spent + held for spent, held in asyncio.run(read())]
    else:
        by_start: dict[float, dict] = {}
        used = []
        for who, b, _ in wanted:
            start = window(b.period, now)[0]
            if start not in by_start:
                by_start[start] = used_since(store, start)
            tokens, nanos = by_start[start].get(who, (0, 0))
            used.append(nanos if b.money else tokens)
    out: dict[tuple[str, str], list[tuple]] = {}
    for (who, b, _), u in zip(wanted, used, strict=True):
        out.setdefault(who, []).append((b, u, max(0, b.amount - u)))
    return out


async def seed_counters(keeper, dsn: str, timeouts: tuple[float, float]) -> int:
    """Seed the keeper's budget counters with the store's figures (a counter that exists is left
    as it is); the number of counters offered."""
    import asyncio
    import time

    from prefixgate.store import open_store

    def read():
        with open_store(dsn, statement_timeout=timeouts[0], lock_timeout=timeouts[1]) as store:
            if store.schema_version() == 0:
                return []
            store.migrate()
            return seeds(store, keeper.currency, time.time())

    rows = await asyncio.to_thread(read)
    for counter, spent, ttl in rows:
        await keeper.counters.seed(counter, spent, ttl)
    return len(rows)


__all__ = ["seed_counters", "seeds", "standing", "used_since"]
