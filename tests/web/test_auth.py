"""Admin auth in front of the dashboard: headers for API clients, a login form for a
browser (tests/web/test_login.py); open only on an open loopback gateway without an admin
key."""

from __future__ import annotations

import hashlib

import httpx

from prefixgate.config import parse_config
from prefixgate.gateway import NullRecorder
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.web import dashboard_routes
from tests.web.conftest import ADMIN_KEY


def test_api_needs_the_admin_key(guarded_dashboard):
    url = f"{guarded_dashboard}/dashboard/api/overview"
    r = httpx.get(url)
    assert r.status_code == 401 and "admin key" in r.json()["error"]
    assert httpx.get(url, headers={"x-api-key": "wrong"}).status_code == 401
    assert httpx.get(url, headers={"x-api-key": ADMIN_KEY}).status_code == 200
    auth = {"authorization": f"Bearer {ADMIN_KEY}"}
    assert httpx.get(url, headers=auth, params={"since": "all"}).json()["totals"]["requests"] > 0


def test_pages_ask_for_the_key_and_never_leak_data(guarded_dashboard):
    for path in ("/dashboard", "/dashboard/doctor", "/dashboard/requests/abc"):
        r = httpx.get(guarded_dashboard + path)
        assert r.status_code == 401
        assert 'method="post"' in r.text and 'name="key"' in r.text
        assert "claude-cli" not in r.text
    # the admin key in a URL is refused; a key name there is the filter (tests/security)
    assert httpx.get(f"{guarded_dashboard}/dashboard", params={"key": ADMIN_KEY}).status_code == 400
    assert httpx.get(f"{guarded_dashboard}/dashboard?key=wrong").status_code == 401
    # Static files carry no data: the login page can be styled.
    assert httpx.get(f"{guarded_dashboard}/dashboard/static/dashboard.css").status_code == 200


def test_a_forged_cookie_opens_nothing(guarded_dashboard):
    for forged in ("forged", ADMIN_KEY, "x" * 5000):
        with httpx.Client(base_url=guarded_dashboard, cookies={"prefixgate_session": forged}) as c:
            assert c.get("/dashboard/api/meta").status_code == 401
            assert c.get("/dashboard").status_code == 401


def test_open_loopback_gateway_without_admin_key_is_open(dashboard):
    assert httpx.get(f"{dashboard}/dashboard/api/meta").status_code == 200
    assert httpx.get(f"{dashboard}/dashboard").status_code == 200


def test_gateway_with_client_keys_but_no_admin_key_refuses(demo_stores):
    digest = hashlib.sha256(b"client-key").hexdigest()
    config = parse_config(
        {
            "channels": [{"name": "c", "base_url": "http://127.0.0.1:9/v1"}],
            "keys": [{"name": "alice", "key_sha256": digest}],
            "store": {"dsn": demo_stores.incident},
        }
    )
    app = create_app(config, recorder=NullRecorder())
    if not any(getattr(r, "path", "") == "/dashboard" for r in app.routes):
        app.router.routes.extend(dashboard_routes(app.state.gateway, demo_stores.incident))
    with ServerThread(app) as srv:
        r = httpx.get(f"{srv.url}/dashboard/api/meta", headers={"x-api-key": "client-key"})
        assert r.status_code == 403
        assert httpx.get(f"{srv.url}/dashboard").status_code == 403
        login = httpx.post(f"{srv.url}/dashboard/login", data={"key": "client-key"})
        assert login.status_code == 403 and "set-cookie" not in login.headers
