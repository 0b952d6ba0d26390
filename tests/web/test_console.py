"""The console: the admin JSON API for keys, budgets and the audit log, driven over HTTP
with the admin key in a header (scripts) and by the page in Chromium (the admin's session):
a key created with a budget and used through the OpenAI SDK until refused, its budget
raised, rotated (the old key refused at once), revoked; the audit log shows each step and
never a key."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import httpx
import openai
import pytest

from prefixgate.config import parse_config
from prefixgate.serve.app import build_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from tests.conftest import scripted_upstream
from tests.fakes import Reply
from tests.web.conftest import ADMIN_KEY
from tests.web.test_browser import Page, until
from tests.web.test_browser import browser as browser  # the Chromium fixture

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture
def console(tmp_path) -> Iterator[tuple[str, str]]:
    """A gateway with store keys and an admin key, over a scripted upstream: (URL, the
    store's DSN)."""
    with scripted_upstream() as up:
        up.script = lambda body: Reply(text="ok", prompt_tokens=100, completion_tokens=7)
        raw = {
            "channels": [{"name": "main", "base_url": up.url, "render_order": "tools_first"}],
            "store": {"dsn": f"sqlite:///{tmp_path / 'console.db'}", "journal_path": None},
            "store_keys": True,
            "admin_key_sha256": hashlib.sha256(ADMIN_KEY.encode()).hexdigest(),
        }
        with ServerThread(build_app(parse_config(raw))) as srv:
            yield srv.url, raw["store"]["dsn"]


def _chat(url: str, key: str) -> int:
    """One chat request through the OpenAI SDK with ``key``: its status."""
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    try:
        client.chat.completions.create(
            model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        )
        return 200
    except openai.APIStatusError as exc:
        return exc.status_code
    finally:
        client.close()


def test_a_script_manages_keys_through_the_admin_api(console):
    url, _ = console
    api = url + "/dashboard/api"
    assert httpx.post(api + "/keys", json={"name": "bob"}).status_code == 401  # admin only
    r = httpx.post(api + "/keys", headers=ADMIN, json={"name": "bob", "budgets": ["1M tokens/day"]})
    assert r.status_code == 200, r.text
    key = r.json()["key"]
    assert key.startswith("pg-") and r.json()["shown_once"]
    assert _chat(url, key) == 200
    listed = httpx.get(api + "/keys", headers=ADMIN).json()["keys"]
    assert [k["name"] for k in listed] == ["bob"] and key not in str(listed)
    assert listed[0]["budgets"][0]["budget"] == "1M tokens/day"
    # Bad input is the caller's error, said; a second key of the same name is a conflict.
    bad = httpx.post(api + "/keys", headers=ADMIN, json={"name": "bob", "budgets": ["lots"]})
    assert bad.status_code == 400 and "lots" in bad.json()["error"]
    assert httpx.post(api + "/keys", headers=ADMIN, json={"name": "a b"}).status_code == 400
    assert httpx.post(api + "/keys", headers=ADMIN, content=b"[1]").status_code == 400
    assert httpx.post(api + "/keys", headers=ADMIN, json={"name": "bob"}).status_code == 409
    assert httpx.post(api + "/keys/nobody/rotate", headers=ADMIN).status_code == 404
    # A page of another site cannot make changes, even with the admin's credentials.
    evil = {**ADMIN, "origin": "https://evil.example"}
    assert httpx.post(api + "/keys/bob/revoke", headers=evil).status_code == 403
    rotated = httpx.post(api + "/keys/bob/rotate", headers=ADMIN).json()["key"]
    assert _chat(url, key) == 401 and _chat(url, rotated) == 200
    assert httpx.post(api + "/keys/bob/revoke", headers=ADMIN).status_code == 200
    assert _chat(url, rotated) == 401
    audit = httpx.get(api + "/audit", headers=ADMIN).json()["entries"]
    assert [e["action"] for e in audit] == ["revoke", "rotate", "create"]
    assert all(e["target"] == "bob" and e["actor"].startswith("admin key") for e in audit)
    assert key not in str(audit) and rotated not in str(audit)


def _left(pg, budget: str) -> str:
    """What the page says is left of ``budget`` (reloaded: the records reach the store in
    batches)."""
    pg.reload()
    pg.wait_for_selector(f".budget[data-budget='{budget}']")
    return pg.locator(f".budget[data-budget='{budget}'] .left").inner_text()


def test_the_console_in_chromium(browser, console):
    url, dsn = console
    p = Page(browser, url)
    pg = p.page
    pg.on("dialog", lambda d: d.accept())
    pg.goto(url + "/dashboard/keys")
    pg.fill("input[name=key]", ADMIN_KEY)
    pg.click("button[type=submit]")
    pg.wait_for_selector("form#create-key")
    assert pg.url == url + "/dashboard/keys"
    # Create a key with a budget of 300 tokens a day: shown once.
    pg.fill("#create-key input[name=name]", "alice")
    pg.fill("#create-key input[name=owner]", "team-a")
    pg.fill("#create-key textarea[name=budgets]", "300 tokens/day")
    pg.click("#create-key button[type=submit]")
    key = pg.wait_for_selector("#shown-key").inner_text()
    assert key.startswith("pg-")
    pg.wait_for_selector("button[data-rotate=alice]")
    # Used through the SDK until the budget refuses it (107 tokens a request).
    statuses = [_chat(url, key) for _ in range(4)]
    assert statuses[:2] == [200, 200] and statuses[-1] == 429
    until(pg, lambda: _left(pg, "300 tokens/day") == "0 left")
    assert "used 321" in pg.locator(".budget[data-budget='300 tokens/day']").inner_text()
    # A larger budget: the key works again.
    pg.fill("form[data-budgets=alice] input[name=budgets]", "1M tokens/day")
    pg.click("form[data-budgets=alice] button[type=submit]")
    pg.wait_for_selector(".budget[data-budget='1M tokens/day']")
    assert _chat(url, key) == 200
    # Rotate: a new key shown once, the old one refused at once.
    pg.click("button[data-rotate=alice]")
    until(pg, lambda: pg.locator("#shown-key").inner_text() != key)
    new = pg.locator("#shown-key").inner_text()
    assert _chat(url, key) == 401 and _chat(url, new) == 200
    p.shot("console-keys")
    # Revoke: refused too.
    pg.click("button[data-revoke=alice]")
    pg.wait_for_selector("tr.muted .pill")
    assert _chat(url, new) == 401
    audit = pg.locator("#audit table").inner_text()
    for action in ("create", "budgets", "rotate", "revoke"):
        assert action in audit
    assert key not in audit and new not in audit
    p.shot("console-audit")
    pg.close()
    p.errors = [e for e in p.errors if "401" not in e and "429" not in e]
    assert p.errors == []
    # The store has the digests and the audit rows, never a key.
    with open_store(dsn) as store:
        [row] = store.list_keys()
        assert row.digest == hashlib.sha256(new.encode()).hexdigest() and not row.active
        kept = str(store.list_audit()) + str(row)
    assert key not in kept and new not in kept


def test_a_rotation_takes_effect_at_once_on_every_worker(tmp_path, upstream):
    """``serve --workers 2``: a key created, rotated and revoked through one worker is
    known, refused and refused on both at once (40 requests on new connections each time:
    the kernel spreads them over both workers), not at the next periodic refresh."""
    from tests.serve.served import Served

    upstream.script = lambda body: Reply(text="ok")
    cfg = {
        "embedded_upstream": False,
        "channels": [{"name": "main", "base_url": upstream.url, "render_order": "tools_first"}],
        "store": {"dsn": f"sqlite:///{tmp_path / 'keys.db'}", "journal_path": None},
        "store_keys": True,
        "admin_key_sha256": hashlib.sha256(ADMIN_KEY.encode()).hexdigest(),
    }

    def statuses(url: str, key: str) -> set[int]:
        out = set()
        for _ in range(40):
            r = httpx.post(
                url + "/v1/chat/completions",
                headers={"authorization": f"Bearer {key}", "connection": "close"},
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            )
            out.add(r.status_code)
        return out

    with Served(tmp_path, cfg, "--workers", "2") as gw:
        api = gw.url + "/dashboard/api/keys"
        key = httpx.post(api, headers=ADMIN, json={"name": "carol"}).json()["key"]
        assert statuses(gw.url, key) == {200}
        new = httpx.post(api + "/carol/rotate", headers=ADMIN).json()["key"]
        assert statuses(gw.url, key) == {401}
        assert statuses(gw.url, new) == {200}
        assert httpx.post(api + "/carol/revoke", headers=ADMIN).status_code == 200
        assert statuses(gw.url, new) == {401}
    assert gw.returncode == 0, gw.output
