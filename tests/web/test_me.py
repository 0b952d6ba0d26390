"""A key holder's own view: ``GET /v1/me`` with their key (scripts) and ``/dashboard/me``
after signing in with it (Chromium). Two holders, alice and bob, each with sessions of
their own: each sees their usage, budgets, hit rate, sessions, prefix breaks and the
doctor's findings about their requests, and never the other's, by URL or by API; a
rotated key ends its sessions."""

from __future__ import annotations

import time

import httpx
import openai

from tests.web.conftest import ADMIN_KEY
from tests.web.test_browser import browser as browser  # the Chromium fixture
from tests.web.test_console import ADMIN, signed_in
from tests.web.test_console import console as console  # the gateway with store keys


def _key(url: str, name: str, **extra) -> str:
    r = httpx.post(url + "/dashboard/api/keys", headers=ADMIN, json={"name": name, **extra})
    assert r.status_code == 200, r.text
    return r.json()["key"]


def _use(url: str, key: str, session: str, n: int) -> list[str]:
    """``n`` chat requests of one session (``user``): their request ids."""
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    ids = []
    for i in range(n):
        r = client.chat.completions.with_raw_response.create(
            model="m",
            max_tokens=16,
            messages=[{"role": "user", "content": f"turn {i}"}],
            user=session,
        )
        ids.append(r.headers["x-request-id"])
    client.close()
    return ids


def _clocked(url: str, key: str, session: str, n: int) -> None:
    """``n`` requests of one session whose system prompt carries the time (a breaker: the
    prefix changes at the start while the long instructions after it are sent again)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    rules = " ".join(f"Rule {i}: keep the code tidy and tested." for i in range(200))
    for i in range(n):
        client.chat.completions.create(
            model="m",
            max_tokens=16,
            user=session,
            messages=[
                {"role": "system", "content": f"Now: 2026-12-01T10:00:{i:02d}Z. {rules}"},
                {"role": "user", "content": "go on"},
            ],
        )
    client.close()


def _me(url: str, key: str, path: str = "/v1/me") -> dict:
    r = httpx.get(url + path, headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return r.json()


def _recorded(url: str, key: str, n: int) -> dict:
    deadline = time.monotonic() + 30  # records reach the store in batches; a guard
    while time.monotonic() < deadline:
        me = _me(url, key)
        if me["requests"] == n:
            return me
        time.sleep(0.1)
    raise AssertionError(f"{n} requests never recorded: {me}")


def test_each_holder_sees_their_own_through_the_api(console):
    url, _ = console
    alice = _key(url, "alice", owner="team-a", budgets=["1M tokens/day"])
    bob = _key(url, "bob")
    _use(url, alice, "alice-s1", 3)
    _use(url, alice, "alice-s2", 1)
    bobs = _use(url, bob, "bob-s1", 2)
    _clocked(url, alice, "alice-clock", 3)
    me = _recorded(url, alice, 7)
    assert me["key"] == "alice" and me["owner"] == "team-a"
    assert me["prompt_tokens"] == 700 and me["completion_tokens"] == 49
    assert sorted(s["session"] for s in me["sessions"]) == ["alice-clock", "alice-s1", "alice-s2"]
    assert me["budgets"] == [{"budget": "1M tokens/day", "used": 749, "left": 999251}]
    # The clock in the system prompt broke the prefix of two of the session's requests.
    assert {b["session"] for b in me["prefix_breaks"]} == {"alice-clock"}
    assert sum(b["requests"] for b in me["prefix_breaks"]) == 2
    # The doctor's findings about her requests: the clock, found in her records alone.
    [found] = me["findings"]
    assert found["kind"] == "prefix_broken" and "date and time" in found["title"]
    assert "messages[0]" in found["title"] and found["facts"]["tokens_lost"] > 0
    bobs_view = _recorded(url, bob, 2)
    assert bobs_view["sessions"][0]["session"] == "bob-s1"
    assert bobs_view["findings"] == [] and "alice" not in str(bobs_view)
    # Nothing in the URL chooses whose records are read.
    assert _me(url, alice, "/v1/me?key_name=bob&key=bob")["key"] == "alice"
    assert _me(url, alice, "/dashboard/api/me")["key"] == "alice"
    # A holder's key opens none of the admin's API, nor another key's request.
    holder = {"authorization": f"Bearer {alice}"}
    for path in (
        "/dashboard/api/requests",
        f"/dashboard/api/requests/{bobs[0]}",
        "/dashboard/api/keys",
    ):
        assert httpx.get(url + path, headers=holder).status_code == 401, path
    assert httpx.post(url + "/dashboard/api/keys/bob/revoke", headers=holder).status_code == 401
    assert httpx.get(url + "/v1/me").status_code == 401
    assert httpx.get(url + "/v1/me", headers={"authorization": "Bearer nope"}).status_code == 401


def test_a_holder_signs_in_and_sees_only_their_own(browser, console):
    url, _ = console
    alice = _key(url, "alice")
    bob = _key(url, "bob")
    _use(url, alice, "alice-s1", 2)
    _clocked(url, alice, "alice-clock", 3)
    _clocked(url, bob, "bob-clock", 3)  # a finding of bob's, never shown to alice
    bobs = _use(url, bob, "bob-s1", 1)
    _recorded(url, alice, 5)
    assert _recorded(url, bob, 4)["findings"]
    p = signed_in(browser, url, "/dashboard/login", alice, "#me[data-key=alice]")
    pg = p.page
    assert pg.url == url + "/dashboard/me"
    sessions = pg.locator("table.my-sessions").inner_text()
    assert "alice-s1" in sessions and "bob" not in pg.content()
    [card] = pg.locator("#my-findings .finding").all()
    assert card.get_attribute("data-kind") == "prefix_broken"
    assert "date and time" in card.inner_text()
    assert alice not in pg.content()
    assert pg.locator("nav a").all_inner_texts() == ["My usage"]
    assert "null" not in pg.locator("#content").inner_text()
    p.shot("me")
    # The admin's pages and another key's request, by URL: refused.
    for path in ("/dashboard", "/dashboard/requests", f"/dashboard/requests/{bobs[0]}"):
        assert pg.goto(url + path).status == 403, path
        assert "your own view" in pg.content()
    assert pg.goto(url + f"/dashboard/api/requests/{bobs[0]}").status == 403
    assert pg.goto(url + "/dashboard/api/keys").status == 403
    assert "bob-s1" not in pg.goto(url + "/dashboard/api/me?key=bob").text()  # refused, 400
    # The admin rotates alice's key: her session ends with it.
    r = httpx.post(url + "/dashboard/api/keys/alice/rotate", headers=ADMIN)
    assert r.status_code == 200
    assert pg.goto(url + "/dashboard/me").status == 401
    assert ADMIN_KEY not in pg.content()
    pg.close()
    # The refusals above are expected, and so is /favicon.ico's 404 (a JSON page opened
    # in the tab makes the browser ask for it).
    p.errors = [e for e in p.errors if not any(f"{s} (" in e for s in (400, 401, 403, 404))]
    assert p.errors == []
