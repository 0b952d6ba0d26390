"""The dashboard's admin login over loopback: the key goes once in a POST form's body, the
browser keeps a random session token in an HttpOnly SameSite=Strict cookie, the store only
the token's digest; logout, lifetimes, rate limit, cross-site refusal, replicas sharing
sessions through the store, and a changed admin key ending them."""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from prefixgate.web.login import COOKIE
from tests.web.conftest import ADMIN_KEY


def login(
    client: httpx.Client, key: str = ADMIN_KEY, next_url: str = "/dashboard"
) -> httpx.Response:
    """Submit the login form as a browser does (its Origin is the dashboard's own)."""
    return client.post(
        "/dashboard/login",
        data={"next": next_url, "key": key},
        headers={"origin": str(client.base_url).rstrip("/")},
    )


def gateway_log(caplog) -> str:
    """What the gateway logged (the HTTP client's own debug lines show the cookie it got)."""
    return "\n".join(
        r.getMessage() for r in caplog.records if r.name.split(".")[0] in ("prefixgate", "uvicorn")
    )


def session_rows(tmp_path: Path) -> list[tuple]:
    with sqlite3.connect(tmp_path / "sessions.db") as conn:
        return conn.execute(
            "SELECT digest, admin, last_seen, expires_at FROM dashboard_sessions"
        ).fetchall()


def test_the_form_opens_a_session_whose_cookie_holds_a_random_token(
    login_gateway, tmp_path, caplog
):
    caplog.set_level(logging.DEBUG)
    base = login_gateway()
    with httpx.Client(base_url=base) as client:
        page = client.get("/dashboard/doctor", params={"since": "all"})
        assert page.status_code == 401
        assert '<form method="post" action="/dashboard/login"' in page.text
        assert 'name="next" value="/dashboard/doctor?since=all"' in page.text
        r = login(client, next_url="/dashboard/doctor?since=all")
        assert r.status_code == 303, r.text
        assert r.headers["location"] == "/dashboard/doctor?since=all"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert "Path=/dashboard" in cookie and "Secure" not in cookie  # plain HTTP here
        token = client.cookies[COOKIE]
        assert ADMIN_KEY not in token and len(token) >= 43  # 32 random bytes
        ok = client.get("/dashboard/doctor")
        assert ok.status_code == 200 and 'action="/dashboard/logout"' in ok.text
        assert client.get("/dashboard/api/meta", params={"since": "all"}).status_code == 200
        # A second login is another session with another token.
        login(client)
        assert client.cookies[COOKIE] != token
    # The store keeps the token's digest, never the token or the key.
    digests = [row[0] for row in session_rows(tmp_path)]
    assert hashlib.sha256(token.encode()).hexdigest() in digests and len(digests) == 2
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("sessions.db*"))
    assert token.encode() not in raw and ADMIN_KEY.encode() not in raw
    logged = gateway_log(caplog)
    assert ADMIN_KEY not in logged and token not in logged
    assert "dashboard: a login from 127.0.0.1" in logged


def test_secure_cookie_when_asked(login_gateway):
    with httpx.Client(base_url=login_gateway(secure_cookie=True)) as client:
        assert "Secure" in login(client).headers["set-cookie"]


def test_a_wrong_key_is_refused_and_never_echoed(login_gateway, caplog):
    caplog.set_level(logging.DEBUG)
    guess = "guess-0123456789abcdef"
    with httpx.Client(base_url=login_gateway()) as client:
        r = login(client, key=guess, next_url="/dashboard/requests?client=opencode")
        assert r.status_code == 401 and "wrong admin key" in r.text
        assert guess not in r.text and "set-cookie" not in r.headers
        assert 'value="/dashboard/requests?client=opencode"' in r.text  # a retry goes there
        assert client.get("/dashboard/api/meta").status_code == 401
        empty = login(client, key="")
        assert empty.status_code == 401 and "set-cookie" not in empty.headers
    assert guess not in caplog.text  # nor anywhere else: it only went in a form body
    assert "a login from 127.0.0.1 with a wrong admin key" in gateway_log(caplog)


def test_the_key_in_a_url_is_refused_everywhere(login_gateway):
    with httpx.Client(base_url=login_gateway()) as client:
        for path in ("/dashboard", "/dashboard/doctor", "/dashboard/login"):
            r = client.get(path, params={"key": ADMIN_KEY, "since": "all"})
            assert r.status_code == 400 and "never accepted in a URL" in r.text
            assert ADMIN_KEY not in r.text and "set-cookie" not in r.headers
        api = client.get("/dashboard/api/meta", params={"key": ADMIN_KEY})
        assert api.status_code == 400 and "never accepted in a URL" in api.json()["error"]
        assert ADMIN_KEY not in api.text
        post = client.post("/dashboard/login", params={"key": ADMIN_KEY}, data={"key": ADMIN_KEY})
        assert post.status_code == 400 and "set-cookie" not in post.headers
        # Not even beside a valid session.
        assert login(client).status_code == 303
        assert client.get("/dashboard", params={"key": ADMIN_KEY}).status_code == 400
        assert client.get("/dashboard").status_code == 200
        # a key's name is the dashboard's filter, not a credential
        assert client.get("/dashboard", params={"key": "alice"}).status_code == 200


def test_logout_ends_the_session_for_every_holder_of_the_cookie(login_gateway, tmp_path):
    base = login_gateway()
    with httpx.Client(base_url=base) as client:
        login(client)
        token = client.cookies[COOKIE]
        r = client.post("/dashboard/logout", headers={"origin": base})
        assert r.status_code == 303 and r.headers["location"] == "/dashboard/login"
        assert f'{COOKIE}=""' in r.headers["set-cookie"] and "Max-Age=0" in r.headers["set-cookie"]
        assert COOKIE not in client.cookies
        assert client.get("/dashboard").status_code == 401
    assert session_rows(tmp_path) == []
    with httpx.Client(base_url=base, cookies={COOKIE: token}) as replay:
        r = replay.get("/dashboard/api/meta")
        assert r.status_code == 401 and "session has ended" in r.json()["error"]
        assert token not in r.text


def test_login_attempts_are_limited_per_client_address(login_gateway):
    base = login_gateway(login_attempts_per_minute=3)
    with httpx.Client(base_url=base) as client:
        assert [login(client, key=f"guess-{i}").status_code for i in range(3)] == [401] * 3
        r = login(client)  # the right key, past the limit: not even looked at
        assert r.status_code == 429 and "too many login attempts" in r.text
        assert r.headers["retry-after"] == "60" and "set-cookie" not in r.headers
    # Another address has its own count (the loopback net answers from 127.0.0.2 too).
    other = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(base_url=base, transport=other) as client:
        assert login(client).status_code == 303


def test_cross_site_posts_are_refused(login_gateway):
    base = login_gateway()
    with httpx.Client(base_url=base) as client:
        for headers in (
            {"origin": "http://evil.example"},
            {"origin": "null"},
            {"referer": "http://evil.example/page"},
            {"origin": base.replace("127.0.0.1", "localhost")},
        ):
            r = client.post(
                "/dashboard/login", data={"key": ADMIN_KEY, "next": "/dashboard"}, headers=headers
            )
            assert r.status_code == 403 and "another site" in r.text
            assert "set-cookie" not in r.headers
        login(client)
        r = client.post("/dashboard/logout", headers={"origin": "http://evil.example"})
        assert r.status_code == 403
        assert client.get("/dashboard").status_code == 200  # still logged in
        # The page's own Referer (same origin) is accepted like its Origin.
        r = client.post(
            "/dashboard/logout", headers={"referer": base + "/dashboard/doctor?since=all"}
        )
        assert r.status_code == 303


@pytest.mark.parametrize(
    "next_url",
    [
        "//evil.example/x",
        "https://evil.example/dashboard",
        "/elsewhere",
        "/dashboardx",
        "/dashboard/login",
        "/dashboard\\@evil.example",
    ],
)
def test_the_return_address_stays_on_the_dashboard(login_gateway, next_url):
    with httpx.Client(base_url=login_gateway()) as client:
        r = login(client, next_url=next_url)
        assert r.status_code == 303 and r.headers["location"] == "/dashboard"


def test_a_bad_form_gets_a_clear_error(login_gateway):
    base = login_gateway()
    with httpx.Client(base_url=base) as client:
        r = client.post("/dashboard/login", json={"key": ADMIN_KEY})
        assert r.status_code == 400 and "x-www-form-urlencoded" in r.text
        r = client.post("/dashboard/login", data={"key": "k" * 10_000})
        assert r.status_code == 413
        r = client.post(
            "/dashboard/login",
            content=b"key=\xff\xfe",
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert r.status_code == 400 and "UTF-8" in r.text
        assert client.get("/dashboard/logout").status_code == 405


@pytest.mark.parametrize(
    "lifetimes",
    [{"session_idle_seconds": 0.5}, {"session_max_seconds": 0.5}],
    ids=["idle", "absolute"],
)
def test_sessions_expire_after_the_configured_lifetime(login_gateway, tmp_path, lifetimes):
    with httpx.Client(base_url=login_gateway(**lifetimes)) as client:
        assert login(client).status_code == 303
        time.sleep(1.0)  # past either lifetime, however slow the machine
        r = client.get("/dashboard/api/meta")
        assert r.status_code == 401 and "session has ended" in r.json()["error"]
        page = client.get("/dashboard")
        assert page.status_code == 401 and "Log in" in page.text
    assert session_rows(tmp_path) == []  # the expired row is gone


def test_replicas_share_sessions_and_a_new_admin_key_ends_them(login_gateway):
    a, b = login_gateway(), login_gateway()  # two gateways over one store
    rotated = login_gateway(admin_key="the-next-admin-key")
    with httpx.Client(base_url=a) as client:
        login(client)
        token = client.cookies[COOKIE]
    with httpx.Client(base_url=b, cookies={COOKIE: token}) as client:
        assert client.get("/dashboard/api/meta").status_code == 200
    with httpx.Client(base_url=rotated, cookies={COOKIE: token}) as client:
        r = client.get("/dashboard/api/meta")
        assert r.status_code == 401 and "session has ended" in r.json()["error"]
    # The replica not yet rotated still accepts it (a rolling change does not ping-pong).
    with httpx.Client(base_url=a, cookies={COOKIE: token}) as client:
        assert client.get("/dashboard/api/meta").status_code == 200


def test_scripts_use_the_bearer_header_not_a_session(login_gateway):
    with httpx.Client(base_url=login_gateway()) as client:
        auth = {"authorization": f"Bearer {ADMIN_KEY}"}
        page = client.get("/dashboard/doctor", headers=auth)
        assert page.status_code == 200 and "set-cookie" not in page.headers
        wrong = client.get("/dashboard/api/meta", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "nope" not in wrong.text
        assert client.get("/dashboard/api/meta", params={"key": ADMIN_KEY}).status_code == 400


def test_an_open_gateway_needs_no_login(dashboard):
    with httpx.Client(base_url=dashboard) as client:
        r = client.get("/dashboard/login", params={"next": "/dashboard/doctor"})
        assert r.status_code == 303 and r.headers["location"] == "/dashboard/doctor"
        page = client.get("/dashboard")
        assert page.status_code == 200 and "logout" not in page.text


@pytest.mark.postgres
def test_sessions_in_postgres_serve_every_replica(login_gateway, pg_database):
    from tests.conftest import pg_schema_dsn

    dsn = pg_schema_dsn(pg_database)
    a, b = login_gateway(dsn=dsn, login_attempts_per_minute=2), login_gateway(dsn=dsn)
    with httpx.Client(base_url=a) as client:
        assert login(client, key="wrong").status_code == 401
        assert login(client).status_code == 303
        token = client.cookies[COOKIE]
        assert login(client).status_code == 429  # counted in the store, across replicas
    with httpx.Client(base_url=b, cookies={COOKIE: token}) as client:
        assert client.get("/dashboard").status_code == 200
        assert client.post("/dashboard/logout").status_code == 303
    with httpx.Client(base_url=a, cookies={COOKIE: token}) as client:
        assert client.get("/dashboard/api/meta").status_code == 401
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT COUNT(*) FROM dashboard_sessions").fetchone()[0] == 0
        assert conn.execute("SELECT COUNT(*) FROM dashboard_logins").fetchone()[0] == 2
