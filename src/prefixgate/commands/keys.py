"""`prefixgate keys`: API keys as digests, in the config or in the store."""

from __future__ import annotations

import hashlib
import secrets
import sys

import click

from prefixgate.commands.common import config_of, store_dsn_of
from prefixgate.commands.common import with_store as _with_store


@click.group()
def keys() -> None:
    """API keys: generate one and the digest to put in the config."""


def _key_store(store_dsn: str | None, config_path: str | None):
    from prefixgate.store import open_store

    store = open_store(store_dsn_of(store_dsn, config_of(config_path)))
    store.migrate()
    return store


@keys.command("create")
@click.argument("name")
@click.option("--owner", default=None, help="Who the key belongs to (a team, a person).")
@click.option(
    "--models", default="", help="Allowed models, comma-separated (default: every model)."
)
@click.option(
    "--budget",
    "budgets",
    multiple=True,
    help="A budget, '<amount> <unit>/<period>': '2M tokens/day', '50 USD/month' (repeatable).",
)
@click.option("--prefix", default="pg-", show_default=True)
@_with_store
def keys_create(name, owner, models, budgets, prefix, store_dsn, config_path) -> None:
    """Create an API key in the store and print it ONCE; only its digest is kept. The
    gateway accepts store keys when its config has `store_keys: true`."""
    from prefixgate.store import StoreError

    key = prefix + secrets.token_urlsafe(32)
    allowed = tuple(m.strip() for m in models.split(",") if m.strip())
    lines = _checked_budgets(budgets, config_path)
    with _key_store(store_dsn, config_path) as store:
        try:
            digest = hashlib.sha256(key.encode()).hexdigest()
            store.create_key(name, owner, digest, allowed, lines)
        except StoreError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(key)
    click.echo(f"created key {name!r} (shown once; only its digest is stored)", err=True)


def _currency(config) -> str:
    return config.prices.currency if config is not None and config.prices else "USD"


def _checked_budgets(lines, config_path) -> tuple[str, ...]:
    from prefixgate.spend.budgets import BudgetSyntaxError, parse_budget

    currency = _currency(config_of(config_path))
    for text in lines:
        try:
            parse_budget(text, currency)
        except BudgetSyntaxError as exc:
            raise click.BadParameter(str(exc), param_hint="--budget") from None
    return tuple(t.strip() for t in lines)


@keys.command("budget")
@click.argument("name")
@click.argument("budgets", nargs=-1)
@_with_store
def keys_budget(name, budgets, store_dsn, config_path) -> None:
    """Set a store key's budgets (none given: no budget); gateways apply them within
    seconds. E.g. `prefixgate keys budget alice "2M tokens/day" "50 USD/month"`."""
    lines = _checked_budgets(budgets, config_path)
    with _key_store(store_dsn, config_path) as store:
        if not store.set_key_budgets(name, lines):
            raise click.ClickException(f"no active key named {name!r}")
    click.echo(f"{name!r}: " + ("; ".join(lines) if lines else "no budget"))


@keys.command("list")
@click.option("--json", "as_json", is_flag=True)
@_with_store
def keys_list(as_json, store_dsn, config_path) -> None:
    """List the keys (names, owners, models, digests' first characters) and what is left
    of their budgets and their owners'. With --config, the config's keys too, and the
    budgets' use read from the shared ledger when the gateways share one (in-flight holds
    included), else from the store's records."""
    import json
    import time

    from prefixgate.spend.budgets import owner_lines, parse_budget
    from prefixgate.spend.prices import fmt_money
    from prefixgate.spend.standing import standing

    config = config_of(config_path)
    currency = _currency(config)
    with _key_store(store_dsn, config_path) as store:
        rows = [("store", r) for r in store.list_keys()]
        rows += [("config", k) for k in (config.keys if config is not None else ())]
        budgets = {}
        for _, r in rows:
            budgets[("key", r.name)] = tuple(parse_budget(b, currency) for b in r.budgets)
        config_owners = config.budgets.owners if config is not None else {}
        for owner, (_, lines) in owner_lines(config_owners, store.list_owner_budgets()).items():
            budgets[("owner", owner)] = tuple(parse_budget(b, currency) for b in lines)
        shared = config.budgets_shared if config is not None else None
        left = standing(store, budgets, currency, time.time(), shared)

    def money_or_tokens(b, n) -> str | int:
        return fmt_money(n, 6) if b.money else n

    def budget_view(who) -> list[dict]:
        return [
            {"budget": b.text, "used": money_or_tokens(b, u), "left": money_or_tokens(b, lf)}
            for b, u, lf in left.get(who, ())
        ]

    if as_json:
        out = []
        for source, r in rows:
            item = {"name": r.name, "source": source, "owner": r.owner, "models": list(r.models)}
            if source == "store":
                item.update(
                    digest_prefix=r.digest[:12], created_at=r.created_at, revoked_at=r.revoked_at
                )
            item["budgets"] = budget_view(("key", r.name))
            item["owner_budgets"] = budget_view(("owner", r.owner)) if r.owner else []
            out.append(item)
        click.echo(json.dumps(out, indent=2))
        return
    for source, r in rows:
        state = "revoked" if getattr(r, "revoked_at", None) else "active"
        models = ",".join(r.models) or "*"
        digest = (
            r.digest()[:12]
            if source == "config" and r.key_sha256
            else (r.digest[:12] if source == "store" else "(env)")
        )
        click.echo(
            f"{r.name:20} {state:8} owner={r.owner or '-':12} models={models:20} "
            f"sha256={digest}… ({source})"
        )
        for scope, who in (("key", r.name), ("owner", r.owner)):
            for item in budget_view((scope, who)) if who else ():
                click.echo(
                    f"    {scope:5} {item['budget']:22} used {item['used']}  left {item['left']}"
                )


@keys.command("revoke")
@click.argument("name")
@_with_store
def keys_revoke(name, store_dsn, config_path) -> None:
    """Revoke a store key; gateways stop accepting it within seconds."""
    with _key_store(store_dsn, config_path) as store:
        if not store.revoke_key(name):
            raise click.ClickException(f"no active key named {name!r}")
    click.echo(f"revoked {name!r}")


@keys.command("hash")
@click.argument("key", required=False)
def keys_hash(key: str | None) -> None:
    """Print the SHA-256 digest of KEY (read from stdin when omitted) for key_sha256."""
    if key is None:
        key = sys.stdin.readline().strip()
    click.echo(hashlib.sha256(key.encode()).hexdigest())


@keys.command("new")
@click.option("--prefix", default="pg-", show_default=True)
def keys_new(prefix: str) -> None:
    """Generate a new random key and print it with its digest (store only the digest)."""
    key = prefix + secrets.token_urlsafe(32)
    click.echo(f"key:        {key}")
    click.echo(f"key_sha256: {hashlib.sha256(key.encode()).hexdigest()}")
