"""The pages the product serves through other people's templates, in a real browser (Debian's Chromium, Playwright)
at a phone's and a desktop's width: Django's admin (as staff), DRF's browsable API and the Swagger UI of
/api/docs/. Each carries the product's header, scrolls no element past a 390 px viewport, has no serious or
critical axe-core violation, and is kept as a screenshot in test-artifacts/screenshots/, as the dashboard's
pages are (tests/dashboard/test_browser_site.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import Client
from playwright.sync_api import Browser, Page, sync_playwright

from tests.dashboard.test_browser import CHROMIUM, PASSWORD, SCREENSHOTS
from tests.dashboard.test_browser_site import OVERFLOWING, WIDTHS
from tests.support.axe import serious_violations
from tests.support.gateway_process import GatewayProcess, gateway_env, manage, prepare_gateway

STAFF = "root"
# Signed in as staff (a superuser of no organization: the operator).
STAFF_PAGES = {
    "admin-index": "/admin/",
    "admin-api-keys": "/admin/tenancy/apikey/",
    "admin-organization": "/admin/tenancy/organization/1/change/",
    "admin-users": "/admin/auth/user/",
}
# Signed in as an organization's admin (not staff): the API as a browser sees it, and its documentation.
MEMBER_PAGES = {
    "api-browsable-index": "/api/v1/",
    "api-browsable-models": "/api/v1/models",
    "api-browsable-ledger": "/api/v1/ledger/requests?limit=5",
    "api-browsable-api-keys": "/api/v1/api-keys",
    "api-docs-member": "/api/docs/",
}
ANONYMOUS_PAGES = {"api-docs": "/api/docs/", "admin-login": "/admin/login/"}
# The dashboard's header, whose look every page above repeats.
DASHBOARD = "/dashboard/"
HEADER_LOOK = """() => {
  const header = document.querySelector("header.site");
  if (!header) return null;
  const css = (el) => { const s = getComputedStyle(el); return [s.backgroundColor, s.color, s.fontFamily, s.fontSize]; };
  const brand = header.querySelector("a.brand");
  return {header: css(header), brand: brand ? [brand.textContent.trim(), ...css(brand)] : null,
          top: Math.round(header.getBoundingClientRect().top)};
}"""


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server (manage.py serve) over a fresh SQLite file: a small demo ledger, an organization admin and a
    staff superuser. No worker: nothing here queues work."""
    tmp = tmp_path_factory.mktemp("tools")
    env = gateway_env(
        tmp,
        f"sqlite:///{tmp / 'db.sqlite3'}",
        LEDGER_WRITER="thread",
        CARBONLEDGER_PASSWORD=PASSWORD,
        DJANGO_SUPERUSER_PASSWORD=PASSWORD,
    )
    prepare_gateway(env)
    for args in (
        ("load_demo_ledger", "--org", "acme", "--requests", "500", "--days", "2"),
        ("create_user", "acme", "ada", "--role", "admin"),
        ("createsuperuser", "--noinput", "--username", STAFF, "--email", "root@example.invalid"),
    ):
        done = manage(env, *args)
        assert done.returncode == 0, done.stderr[-2000:]
    server = GatewayProcess(env, tmp / "server.log").start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.terminate()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "Debian's chromium package is needed: apt-get install chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


def _page(browser: Browser, base_url: str, width: int, user: str | None) -> Page:
    context = browser.new_context(base_url=base_url, viewport={"width": width, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.console_errors = errors  # type: ignore[attr-defined]
    if user == STAFF:  # the operator signs in at the admin's door: belonging to no organization, no dashboard
        page.goto("/admin/login/?next=/admin/")
        page.fill("#id_username", user)
        page.fill("#id_password", PASSWORD)
        page.click("#login-form input[type=submit]")
        page.wait_for_url("**/admin/")
    elif user is not None:
        page.goto("/accounts/login/")
        page.fill("#id_username", user)
        page.fill("#id_password", PASSWORD)
        page.click("#login-form button[type=submit]")
        page.wait_for_url("**/dashboard/")
    return page


def _every_page(browser: Browser, base_url: str, width: int) -> Iterator[tuple[str, Page]]:
    for user, pages in ((None, ANONYMOUS_PAGES), (STAFF, STAFF_PAGES), ("ada", MEMBER_PAGES)):
        page = _page(browser, base_url, width, user)
        for name, url in pages.items():
            response = page.goto(url)
            assert response is not None and response.status == 200, (url, response and response.status)
            page.wait_for_load_state("networkidle")
            if "/api/docs/" in url:
                page.wait_for_selector(".swagger-ui .opblock")  # the operations, drawn from the schema
            yield name, page
        assert page.console_errors == [], page.console_errors  # type: ignore[attr-defined]
        page.context.close()


def test_the_admin_api_and_docs_pages_carry_the_dashboards_header(browser: Browser, tools: str) -> None:
    page = _page(browser, tools, 1440, "ada")
    page.goto(DASHBOARD)
    dashboard = page.evaluate(HEADER_LOOK)
    assert dashboard is not None and dashboard["brand"][0] == "CarbonLedger"
    page.context.close()
    differ = {}
    for name, page in _every_page(browser, tools, 1440):
        look = page.evaluate(HEADER_LOOK)
        if look != dashboard:
            differ[name] = look
        # A way back to the dashboard (or to the home page and the login, signed out).
        assert page.locator("header.site a.brand").get_attribute("href") in ("/dashboard/", "/"), name
    assert not differ, f"the dashboard's: {dashboard}\n" + "\n".join(f"{k}: {v}" for k, v in differ.items())


def test_the_admin_says_it_is_the_operators_tool_and_links_back_to_the_dashboard(
    browser: Browser, tools: str
) -> None:
    page = _page(browser, tools, 1440, STAFF)
    page.goto("/admin/")
    note = page.locator(".tool-note").inner_text()
    assert "operator's tool" in note and "staff" in note, note
    assert page.locator(".tool-note a[href='/dashboard/settings']").count() == 1
    assert page.locator("header.site nav a[href='/admin/']").get_attribute("class") == "on"
    assert page.locator("header.site nav a[href='/dashboard/']").count() == 1
    page.context.close()
    # The API's pages point at its documentation.
    page = _page(browser, tools, 1440, "ada")
    page.goto("/api/v1/models")
    assert page.locator(".tool-note a[href='/api/docs/']").count() == 1
    assert page.locator("header.site nav a[href='/admin/']").count() == 0  # not staff: no admin link
    page.context.close()


def test_the_admin_still_edits_a_row(browser: Browser, tools: str) -> None:
    page = _page(browser, tools, 1440, STAFF)
    page.goto("/admin/tenancy/organization/1/change/")
    page.fill("#id_name", "Acme Research")
    page.click("input[name=_save]")
    page.wait_for_url("**/admin/tenancy/organization/")
    assert "was changed successfully" in page.locator(".messagelist").inner_text()
    assert page.locator("#result_list").get_by_text("Acme Research").count() == 1
    assert page.console_errors == []  # type: ignore[attr-defined]
    page.context.close()


def test_the_admin_api_and_docs_pages_do_not_scroll_sideways_at_390_or_1440_px_and_are_kept_as_screenshots(
    browser: Browser, tools: str
) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    problems = {}
    for width in WIDTHS:
        for name, page in _every_page(browser, tools, width):
            page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
            found = page.evaluate(OVERFLOWING)
            if found:
                problems[f"{name} at {width} px"] = found[:5]
    assert not problems, "\n".join(f"{k}: {v}" for k, v in problems.items())


def test_axe_core_finds_no_serious_or_critical_violation_on_the_admin_api_and_docs_pages(
    browser: Browser, tools: str
) -> None:
    problems = {}
    for width in WIDTHS:
        for name, page in _every_page(browser, tools, width):
            serious = serious_violations(page)
            if serious:
                problems[f"{name} at {width} px"] = serious
    assert not problems, "\n".join(f"{k}: {v}" for k, v in problems.items())


@pytest.mark.django_db
def test_the_api_index_in_a_browser_is_the_browsable_page_and_a_client_still_gets_json(
    client: Client,
) -> None:
    # Signed out, a browser still learns where the docs are, on a page with the product's header.
    page = client.get("/api/v1/", HTTP_ACCEPT="text/html,application/xhtml+xml")
    assert page.status_code == 401 and page["Content-Type"].startswith("text/html")
    html = page.content.decode()
    assert (
        '<header class="site">' in html
        and 'href="/api/docs/"' in html
        and "/static/carbonledger/tools.css" in html
    )
    # A client asking for nothing in particular, or for JSON, gets JSON.
    for accept in ({}, {"HTTP_ACCEPT": "application/json"}):
        answer = client.get("/api/v1/", **accept)
        assert answer.status_code == 401 and answer.json()["docs"] == "/api/docs/"
