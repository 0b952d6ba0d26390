"""The console: the admin JSON API for keys, budgets and the audit log, driven over HTTP
with the admin key in a header (scripts) and by the page in Chromium (the admin's session):
a key created with a budget and used through the OpenAI SDK until refused, its budget
raised, rotated (the old key refused at once), revoked; the audit log shows each step and
never a key."""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from prefixgate.config import parse_config
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from tests.conftest import scripted_upstream
from tests.fakes import Reply
from tests.web.conftest import ADMIN_KEY
from tests.web.test_browser import Page, until
from tests.web.test_browser import browser as browser  # the Chromium fixture

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


@contextlib.contextmanager
def console_gateway(tmp_path, **extra) -> Iterator[tuple[str, str]]:
    """A gateway with store keys and an admin key (and ``extra`` config), over a scripted
    upstream (100 prompt and 7 output tokens a request): (URL, the store's DSN)."""
    with scripted_upstream() as up:
        up.script = lambda body: Reply(text="ok", prompt_tokens=100, completion_tokens=7)
        raw = {
            "channels": [{"name": "main", "base_url": up.url, "render_order": "tools_first"}],
            "store": {"dsn": f"sqlite:///{tmp_path / 'console.db'}", "journal_path": None},
            "store_keys": True,
            "admin_key_sha256": hashlib.sha256(ADMIN_KEY.encode()).hexdigest(),
            **extra,
        }
        with ServerThread(create_app(parse_config(raw))) as srv:
            yield srv.url, raw["store"]["dsn"]


@pytest.fixture
def console(tmp_path) -> Iterator[tuple[str, str]]:
    with console_gateway(tmp_path) as served:
        yield served


def signed_in(browser, url: str, path: str, key: str, ready: str) -> Page:
    """A Chromium page at ``path``, signed in with ``key`` on the login form, once
    ``ready`` (a selector) shows."""
    p = Page(browser, url)
    p.page.goto(url + path)
    p.page.fill("input[name=key]", key)
    p.page.click("button[type=submit]")
    p.page.wait_for_selector(ready)
    return p


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


def _stored(dsn: str, n: int) -> None:
    """Until the store holds ``n`` request records. The console reads what is used from
    them, and the writer stores them in batches off the request path: an answer (a
    refusal by the gateway's own ledger too) comes before its record is in the store."""

    def count() -> int:
        with open_store(dsn) as store:
            [(got,)] = store.query("SELECT COUNT(*) FROM requests", [])
        return int(got)

    deadline = time.monotonic() + 60  # a guard against a hang, not a measurement
    while (got := count()) < n:
        assert time.monotonic() < deadline, f"only {got} of {n} request records ever stored"
        time.sleep(0.05)


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
    """``serve --workers 2``: a key created, rotated and revoked (and its owner given a
    budget and none) through one worker is known, refused and refused (refused, served) on
    both at once (40 requests on new connections each time:
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

    def each(url: str, key: str) -> list[int]:
        out = []
        for _ in range(40):
            r = httpx.post(
                url + "/v1/chat/completions",
                headers={"authorization": f"Bearer {key}", "connection": "close"},
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            )
            out.append(r.status_code)
        return out

    def statuses(url: str, key: str) -> set[int]:
        return set(each(url, key))

    with Served(tmp_path, cfg, "--workers", "2") as gw:
        api = gw.url + "/dashboard/api/keys"
        body = {"name": "carol", "owner": "team-w"}
        key = httpx.post(api, headers=ADMIN, json=body).json()["key"]
        assert statuses(gw.url, key) == {200}
        new = httpx.post(api + "/carol/rotate", headers=ADMIN).json()["key"]
        assert statuses(gw.url, key) == {401}
        assert statuses(gw.url, new) == {200}
        # An owner's budget smaller than one request, then none: applied on both at once.
        # (Without `budgets.shared`, each worker counts on its own: each lets one request
        # through while the budget still has room, then refuses.)
        owner = gw.url + "/dashboard/api/owners/team-w/budgets"
        assert httpx.post(owner, headers=ADMIN, json={"budgets": ["1 tokens/day"]}).is_success
        got = each(gw.url, new)
        assert got.count(200) <= 2 and got.count(429) == len(got) - got.count(200)
        assert httpx.post(owner, headers=ADMIN, json={"budgets": []}).is_success
        assert statuses(gw.url, new) == {200}
        assert httpx.post(api + "/carol/revoke", headers=ADMIN).status_code == 200
        assert statuses(gw.url, new) == {401}
    assert gw.returncode == 0, gw.output


def test_a_script_gives_an_owner_budgets(console):
    """``POST /dashboard/api/owners/{owner}/budgets``: every key of the owner fits them
    together; shown with what is used and left; an empty list hands the owner back to the
    config; bad input is the caller's error; each change is in the audit log."""
    url, _ = console
    api = url + "/dashboard/api"
    a = httpx.post(api + "/keys", headers=ADMIN, json={"name": "a1", "owner": "team-b"})
    b = httpx.post(api + "/keys", headers=ADMIN, json={"name": "a2", "owner": "team-b"})
    k1, k2 = a.json()["key"], b.json()["key"]
    assert httpx.post(api + "/owners/team-b/budgets", json={"budgets": []}).status_code == 401
    bad = httpx.post(api + "/owners/team-b/budgets", headers=ADMIN, json={"budgets": ["lots"]})
    assert bad.status_code == 400 and "lots" in bad.json()["error"]
    assert httpx.post(api + "/owners/a%20b/budgets", headers=ADMIN, json={}).status_code == 400
    r = httpx.post(
        api + "/owners/team-b/budgets", headers=ADMIN, json={"budgets": "200 tokens/day"}
    )
    assert r.status_code == 200 and r.json() == {"owner": "team-b", "budgets": ["200 tokens/day"]}
    # 107 tokens a request: the owner's two keys share 200 tokens.
    assert _chat(url, k1) == 200 and _chat(url, k2) == 200
    assert {_chat(url, k1), _chat(url, k2)} == {429}
    [owner] = httpx.get(api + "/keys", headers=ADMIN).json()["owners"]
    assert owner["owner"] == "team-b" and owner["source"] == "console"
    assert owner["keys"] == ["a1", "a2"] and owner["budgets"][0]["budget"] == "200 tokens/day"
    cleared = httpx.post(api + "/owners/team-b/budgets", headers=ADMIN, json={"budgets": []})
    assert cleared.status_code == 200
    assert _chat(url, k1) == 200  # no owner's budget left (none in the config)
    [owner] = httpx.get(api + "/keys", headers=ADMIN).json()["owners"]
    assert owner["source"] is None and owner["budgets"] == []
    audit = httpx.get(api + "/audit", headers=ADMIN).json()["entries"]
    changes = [(e["action"], e["target"], e["detail"]) for e in audit[:2]]
    assert changes == [
        ("owner budgets", "owner team-b", "none (the config's apply)"),
        ("owner budgets", "owner team-b", "200 tokens/day"),
    ]


def test_the_consoles_owner_budget_takes_the_place_of_the_configs(tmp_path):
    """An owner with a budget in the config and one set in the console: the console's
    applies; cleared, the config's applies again."""
    owners = {"owners": {"team-c": ["100 tokens/day"]}}
    with console_gateway(tmp_path, budgets=owners) as (url, dsn):
        api = url + "/dashboard/api"
        r = httpx.post(api + "/keys", headers=ADMIN, json={"name": "c1", "owner": "team-c"})
        key = r.json()["key"]
        assert _chat(url, key) == 200 and _chat(url, key) == 429  # the config's
        _stored(dsn, 2)
        [owner] = httpx.get(api + "/keys", headers=ADMIN).json()["owners"]
        assert owner["source"] == "config" and owner["budgets"][0]["left"] == 0
        body = {"budgets": ["1M tokens/day"]}
        assert httpx.post(api + "/owners/team-c/budgets", headers=ADMIN, json=body).is_success
        assert _chat(url, key) == 200  # the console's
        [owner] = httpx.get(api + "/keys", headers=ADMIN).json()["owners"]
        assert owner["source"] == "console" and owner["budgets"][0]["budget"] == "1M tokens/day"
        body = {"budgets": []}
        assert httpx.post(api + "/owners/team-c/budgets", headers=ADMIN, json=body).is_success
        assert _chat(url, key) == 429  # the config's again


def test_an_owners_budget_in_chromium(browser, console):
    """The admin gives an owner a budget in the console; the owner's two keys, used through
    the SDK, are refused once they have spent it together; the audit log shows it."""
    url, _ = console
    api = url + "/dashboard/api"
    keys = [
        httpx.post(api + "/keys", headers=ADMIN, json={"name": n, "owner": "team-d"}).json()["key"]
        for n in ("d1", "d2")
    ]
    p = signed_in(browser, url, "/dashboard/keys", ADMIN_KEY, "form[data-owner-budgets=team-d]")
    pg = p.page
    pg.fill("form[data-owner-budgets=team-d] input[name=budgets]", "300 tokens/day")
    pg.click("form[data-owner-budgets=team-d] button[type=submit]")
    pg.wait_for_selector("#owners .budget[data-budget='300 tokens/day']")
    assert "console" in pg.locator("table.owners").inner_text()
    # 107 tokens a request, alternating keys: refused once the owner has spent 300.
    statuses = [_chat(url, keys[i % 2]) for i in range(4)]
    assert statuses[:3] == [200, 200, 200] and statuses[3] == 429
    assert _chat(url, keys[0]) == 429 and _chat(url, keys[1]) == 429

    def owner_left() -> str:
        pg.reload()
        pg.wait_for_selector("#owners .budget[data-budget='300 tokens/day']")
        return pg.locator("#owners .budget[data-budget='300 tokens/day'] .left").inner_text()

    until(pg, lambda: owner_left() == "0 left")
    assert "used 321" in pg.locator("#owners .budget[data-budget='300 tokens/day']").inner_text()
    # A new owner's budget from the form at the top.
    pg.fill("#owner-budgets input[name=owner]", "team-e")
    pg.fill("#owner-budgets input[name=budgets]", "5M tokens/month")
    pg.click("#owner-budgets button[type=submit]")
    pg.wait_for_selector("form[data-owner-budgets=team-e]")
    audit = pg.locator("#audit table").inner_text()
    assert "owner team-d" in audit and "300 tokens/day" in audit and "owner team-e" in audit
    assert not any(k in audit for k in keys)
    p.shot("console-owners")
    pg.close()
    p.errors = [e for e in p.errors if "401" not in e and "429" not in e]
    assert p.errors == []
