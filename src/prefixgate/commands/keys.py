"""`prefixgate keys`: API keys as digests, in the config or in the store."""

from __future__ import annotations

import hashlib
import secrets
import sys

import click

from prefixgate.commands.common import config_of, store_dsn_of


@click.group()
def keys() -> None:
    """API keys: generate one and the digest to put in the config."""


def _key_store(store_dsn: str | None, config_path: str | None):
    from prefixgate.store import open_store

    store = open_store(store_dsn_of(store_dsn, config_of(config_path)))
    store.migrate()
    return store


_store_opts = [
    click.option(
        "--store", "store_dsn", default=None, help="Store DSN (default sqlite:///prefixgate.db)."
    ),
    click.option(
        "--config",
        "config_path",
        type=click.Path(exists=True, dir_okay=False),
        help="Take the store from this config.",
    ),
]


def _with_store(f):
    for opt in reversed(_store_opts):
        f = opt(f)
    return f


@keys.command("create")
@click.argument("name")
@click.option("--owner", default=None, help="Who the key belongs to (a team, a person).")
@click.option(
    "--models", default="", help="Allowed models, comma-separated (default: every model)."
)
@click.option("--prefix", default="pg-", show_default=True)
@_with_store
def keys_create(name, owner, models, prefix, store_dsn, config_path) -> None:
    """Create an API key in the store and print it ONCE; only its digest is kept. The
    gateway accepts store keys when its config has `store_keys: true`."""
    from prefixgate.store import StoreError

    key = prefix + secrets.token_urlsafe(32)
    allowed = tuple(m.strip() for m in models.split(",") if m.strip())
    with _key_store(store_dsn, config_path) as store:
        try:
            store.create_key(name, owner, hashlib.sha256(key.encode()).hexdigest(), allowed)
        except StoreError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(key)
    click.echo(f"created key {name!r} (shown once; only its digest is stored)", err=True)


@keys.command("list")
@click.option("--json", "as_json", is_flag=True)
@_with_store
def keys_list(as_json, store_dsn, config_path) -> None:
    """List the store's keys (names, owners, models, digests' first characters)."""
    import json

    with _key_store(store_dsn, config_path) as store:
        rows = store.list_keys()
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "name": r.name,
                        "owner": r.owner,
                        "models": list(r.models),
                        "digest_prefix": r.digest[:12],
                        "created_at": r.created_at,
                        "revoked_at": r.revoked_at,
                    }
                    for r in rows
                ],
                indent=2,
            )
        )
        return
    for r in rows:
        state = "revoked" if r.revoked_at else "active"
        models = ",".join(r.models) or "*"
        click.echo(
            f"{r.name:20} {state:8} owner={r.owner or '-':12} models={models:20} sha256={r.digest[:12]}…"
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
