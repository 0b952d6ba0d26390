"""The dashboard's SQL is portable: the same queries on Postgres give what they give on
SQLite, over the demo's records copied into the real server (127.0.0.1:5432)."""

from __future__ import annotations

import math

import pytest

from prefixgate.store import open_store
from prefixgate.web import queries
from prefixgate.web.scope import Scope
from tests.conftest import pg_database, pg_schema_dsn  # noqa: F401  (fixture re-export)

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def both(demo_stores, pg_database):  # noqa: F811
    pg = pg_schema_dsn(pg_database)
    with open_store(demo_stores.incident) as src, open_store(pg) as dst:
        dst.migrate()
        dst.write_batch(list(src.iter_records(with_texts=True)))
    lite, post = open_store(demo_stores.incident), open_store(pg)
    yield lite, post
    lite.close()
    post.close()


def same(a, b, path="$"):
    """Equal, floats to 1e-9 relative (the two databases sum doubles in other orders)."""
    if isinstance(a, float) or isinstance(b, float):
        assert a is not None and b is not None, path
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), f"{path}: {a} != {b}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), path
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


ALL = Scope(None, None)


@pytest.mark.parametrize("by", ["endpoint", "client"])
def test_overview_and_distribution_agree(both, by):
    lite, post = both
    same(queries.overview(lite, ALL, by), queries.overview(post, ALL, by))
    same(queries.distribution(lite, ALL, by), queries.distribution(post, ALL, by))


def test_filters_log_detail_and_upstream_agree(both):
    lite, post = both
    scope = Scope(None, None, (("client", "claude-cli"), ("session_kind", "claude-code")))
    same(queries.meta(lite, scope), queries.meta(post, scope))
    same(queries.upstream_stats(lite, ALL), queries.upstream_stats(post, ALL))
    a, b = queries.request_log(lite, scope, limit=5), queries.request_log(post, scope, limit=5)
    same(a["rows"], b["rows"])
    rid = a["rows"][0]["request_id"]
    detail = queries.request_detail(post, rid)
    same(queries.request_detail(lite, rid), detail)
    assert detail["changed_out"]["index"] is not None
