"""The dashboard in a real headless Chromium (Debian's /usr/bin/chromium, driven by
Playwright): every page loads without a console error, charts draw the data, filters change
what is shown. Screenshots go to artifacts/screenshots/ (git-ignored).

Chromium is a system package the tests do not install: without it they FAIL, saying how to
install it (``apt-get install -y chromium``)."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefixgate.lab.events.publisher import EventPublisher, PublisherSettings
from prefixgate.serve.process import ServerThread
from prefixgate.store import open_store
from tests.events.streams import free_port
from tests.web.conftest import ADMIN_KEY, dashboard_app

CHROMIUM = os.environ.get("PREFIXGATE_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
VIEWPORT = {"width": 1440, "height": 900}


@pytest.fixture(scope="module")
def browser() -> Iterator:
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.fail(
            f"Chromium not found at {CHROMIUM}: the dashboard's browser tests need Debian's "
            "chromium package (as root: apt-get update && apt-get install -y chromium)"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "the browser tests need Playwright: pip install playwright (never `playwright install`)"
        )
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


class Page:
    """A browser page that records console errors and uncaught exceptions."""

    def __init__(self, browser, base: str) -> None:
        self.base = base
        self.page = browser.new_page(viewport=VIEWPORT)
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, path: str) -> None:
        sep = "&" if "?" in path else "?"
        self.page.goto(f"{self.base}/dashboard{path}{sep}since=all")
        self.page.wait_for_load_state("networkidle")

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def until(pg, condition, timeout: float = 10.0) -> None:
    """Poll ``condition`` (the pages' CSP forbids evaluating strings, so no
    wait_for_function)."""
    for _ in range(int(timeout / 0.05)):
        if condition():
            return
        pg.wait_for_timeout(50)
    raise AssertionError("condition not met in time")


@pytest.fixture
def page(browser, dashboard) -> Iterator[Page]:
    p = Page(browser, dashboard)
    yield p
    p.page.close()
    assert p.errors == [], f"console errors: {p.errors}"


def test_overview_draws_the_hit_rate_by_slice(page):
    page.open("")
    pg = page.page
    pg.wait_for_selector("#chart-hit-rate path.series-line")
    assert pg.locator("#chart-hit-rate path.series-line").count() == 2
    assert re.fullmatch(r"\d+\.\d%", pg.locator(".kpi.hero .value").inner_text())
    assert pg.locator("#chart-requests rect.bar").count() > 0
    assert pg.locator("#chart-tokens rect.bar").count() > 0
    assert pg.locator("#chart-ttft path.series-line").count() == 3
    legend = pg.locator("#chart-hit-rate .legend").inner_text()
    assert "messages" in legend and "chat" in legend
    page.shot("overview")
    pg.click("button[data-split=client]")
    pg.locator("#chart-hit-rate .legend", has_text="claude-cli").wait_for()
    assert "by=client" in pg.url


def test_distribution_shows_the_pinned_spike(page):
    page.open("/distribution")
    pg = page.page
    marker = pg.wait_for_selector(
        ".slice-card[data-slice=messages] line.marker-line", state="attached"
    )
    pinned = int(pg.get_attribute(".slice-card[data-slice=messages]", "data-pinned"))
    assert int(marker.get_attribute("data-value")) == pinned and pinned % 64 == 0
    # The spike is the tallest bar of its histogram, and the control group has none.
    heights = pg.eval_on_selector_all(
        ".slice-card[data-slice=messages] rect.bar",
        "els => els.map(e => [e.classList.contains('pinned'), +e.getAttribute('height')])",
    )
    assert max(heights, key=lambda x: x[1])[0] is True
    assert pg.locator(".slice-card[data-slice=chat] line.marker-line").count() == 0
    assert "pinned" in pg.locator(".slice-card[data-slice=messages] .callout").inner_text()
    page.shot("distribution")


def test_filters_change_what_is_shown(page):
    page.open("/requests")
    pg = page.page
    pg.wait_for_selector("table.log tbody tr")
    total = pg.locator("table.log tbody tr").count()
    pg.select_option("select[name=client]", "opencode")
    until(pg, lambda: 0 < pg.locator("table.log tbody tr").count() < total)
    clients = pg.locator("table.log tbody tr td:nth-child(3)").all_inner_texts()
    assert set(clients) == {"opencode"}
    assert "client=opencode" in pg.url
    assert 0 < pg.locator("table.log tbody tr").count() < total
    page.shot("requests-filtered")
    # The distribution follows the same filter: only the chat slice is left.
    pg.click("nav a[data-nav=distribution]")
    pg.wait_for_load_state("networkidle")
    pg.goto(pg.url.split("?")[0] + "?since=all&client=opencode")
    pg.wait_for_selector(".slice-card")
    assert pg.locator(".slice-card").count() == 1
    assert pg.locator(".slice-card[data-slice=chat]").count() == 1


def test_request_view_highlights_the_changed_segment(page):
    page.open("/requests?endpoint=messages")
    pg = page.page
    rows = pg.locator("table.log tbody tr")
    rows.first.wait_for()
    rows.nth(0).click()  # the newest: it has a previous request in its session
    pg.wait_for_selector("tr.seg-changed")
    assert "first differs" in pg.locator("#explain").inner_text()
    assert pg.locator("#strip span.changed").count() == 1
    assert pg.locator("#strip span.same").count() >= 1
    pg.locator("tr.seg-changed button.link").click()
    pg.wait_for_selector("tr.seg-changed pre.text ins")
    assert "cch=" in pg.locator("tr.seg-changed").inner_text()
    page.shot("request")
    pg.click("#prev-link")
    pg.wait_for_selector("#explain")


def test_doctor_page_lists_findings_with_evidence(page):
    page.open("/doctor")
    pg = page.page
    card = pg.wait_for_selector("section.finding[data-kind=prefix_broken]")
    assert card.get_attribute("data-severity") == "critical"
    assert "strip_anthropic_billing_header" in card.inner_text()
    assert pg.locator("section.finding[data-kind=prefix_broken] .evidence table").count() >= 3
    assert pg.locator("section.finding[data-kind=l2_write_only]").count() == 1
    page.shot("doctor")


def test_upstream_page_shows_replicas_and_the_host_tier(page):
    page.open("/upstream")
    pg = page.page
    pg.wait_for_selector("section.channel[data-channel=h200-vllm]")
    assert pg.locator("section.channel tbody tr").count() == 2
    assert pg.locator(".l2[data-l2=write_only]").count() == 1
    admission = pg.locator("#admission").inner_text()
    assert "refused (overloaded)" in admission and "refused (loop late)" in admission
    page.shot("upstream")


def test_upstream_page_shows_the_engines_event_publisher(browser, demo_stores):
    """Each replica's KV-event stream: one engine's publisher connected (it connects to the
    address the gateway binds, as vLLM's does), the other replica's never came."""
    live, silent = free_port(), free_port()
    kv = {
        "replicas": [{"endpoint": f"tcp://127.0.0.1:{p}"} for p in (live, silent)],
        "topic": "kv",
    }
    pub = EventPublisher(PublisherSettings(f"tcp://127.0.0.1:{live}", None, "kv"))
    app = dashboard_app(demo_stores.incident, demo_stores.replica, kv_events=kv)
    try:
        with ServerThread(app) as srv:
            st = app.state.events.status("h200-vllm", demo_stores.replica)
            for _ in range(600):  # a hang guard: the publisher retries every 0.1 s
                if st.connected:
                    break
                time.sleep(0.05)
            p = Page(browser, srv.url)
            p.open("/upstream")
            pg = p.page
            cell = pg.wait_for_selector(".kv-events[data-publisher=connected]")
            assert "publisher connected since" in cell.inner_text()
            assert "(connected once)" in cell.inner_text()
            none = pg.locator(".kv-events[data-publisher=none]")
            assert none.count() == 1 and "(never connected)" in none.inner_text()
            p.shot("upstream-kv-events")
            p.page.close()
            assert p.errors == [], f"console errors: {p.errors}"
    finally:
        pub.close()


def test_login_through_the_form_and_logout(browser, tmp_path, demo_stores):
    # A copy of the incident's store: the login's session and attempt rows stay in it.
    dsn = f"sqlite:///{tmp_path / 'incident.db'}"
    with open_store(demo_stores.incident) as src, open_store(dsn) as dst:
        dst.migrate()
        dst.write_batch(list(src.iter_records(with_texts=True)))
    app = dashboard_app(dsn, demo_stores.replica, admin_key=ADMIN_KEY)
    with ServerThread(app) as srv:
        p = Page(browser, srv.url)
        pg = p.page
        resp = pg.goto(f"{srv.url}/dashboard?since=all")
        assert resp.status == 401
        p.shot("login")
        pg.fill("input[name=key]", ADMIN_KEY)
        with pg.expect_request(lambda r: r.method == "POST") as sent:
            pg.click("button[type=submit]")
        assert sent.value.url == f"{srv.url}/dashboard/login"  # the key only in the body
        assert ADMIN_KEY in (sent.value.post_data or "")
        pg.wait_for_selector("#chart-hit-rate path.series-line")
        assert pg.url == f"{srv.url}/dashboard?since=all"
        pg.screenshot(
            path=str(SHOTS / "logged-in.png"), clip={"x": 0, "y": 0, "width": 1440, "height": 120}
        )
        [cookie] = [c for c in pg.context.cookies() if c["name"] == "prefixgate_session"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert cookie["value"] != ADMIN_KEY and ADMIN_KEY not in pg.content()
        # Another page of the same session, then the logout button.
        pg.click("nav a[data-nav=doctor]")
        pg.wait_for_selector("section.finding[data-kind=prefix_broken]")
        pg.click("form.logout button")
        pg.wait_for_selector("input[name=key]")
        assert pg.url == f"{srv.url}/dashboard/login"
        assert not [c for c in pg.context.cookies() if c["name"] == "prefixgate_session"]
        assert pg.goto(f"{srv.url}/dashboard/doctor").status == 401
        p.errors = [e for e in p.errors if "401" not in e]  # the login page itself
        pg.close()
        assert p.errors == []


def test_usage_page_tables_requests_and_cost_by_group(page):
    page.open("/usage?by=client")
    pg = page.page
    pg.wait_for_selector("#usage table.data tbody tr.total")
    groups = pg.locator("#usage table.data tbody tr td:first-child").all_inner_texts()
    assert groups == ["claude-cli", "opencode", "total"] or groups == [
        "opencode",
        "claude-cli",
        "total",
    ]
    assert pg.locator(".kpi").count() == 5
    pg.locator('[data-by="model"]').click()
    until(pg, lambda: "by=model" in pg.url)
    until(pg, lambda: pg.locator("#usage h2").inner_text() == "By model")
    page.shot("usage")


def test_the_miss_ledger_on_the_request_page_and_the_overview(page):
    page.open("/requests?endpoint=messages")
    pg = page.page
    rows = pg.locator("table.log tbody tr")
    rows.first.wait_for()
    rows.nth(0).click()
    pg.wait_for_selector("#ledger-bar span")
    causes = pg.eval_on_selector_all("#ledger-bar span", "els => els.map(e => e.dataset.cause)")
    assert "prefix_changed" in causes  # the billing header changes at token 0, every turn
    assert "source: model" in pg.locator("#ledger").inner_text()
    page.shot("request-ledger")
    page.open("")
    pg.wait_for_selector("#chart-ledger rect.bar")
    assert "prefix changed" in pg.locator("#ledger-totals").inner_text()
    page.shot("overview-ledger")
