"""Every page in a real browser (Debian's Chromium, headless, Playwright) at a phone's and a desktop's width: no
page scrolls sideways, axe-core finds no serious or critical problem, the charts are drawn in the browser with
tooltips and a table alternative, and the range and filters show what the management API returns.
Screenshots of every page at both widths go to test-artifacts/screenshots/."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from carbon import display
from tests.dashboard.test_browser import CHROMIUM, PASSWORD, SCREENSHOTS, product  # noqa: F401 -- fixture
from tests.support.axe import serious_violations
from tests.support.gateway_process import REPO_ROOT

WIDTHS = (390, 1440)
ANONYMOUS_PAGES = {
    "home": "/",
    "login": "/accounts/login/",
    "password-reset": "/accounts/password_reset/",
    "not-found": "/no/such/page",
}
MEMBER_PAGES = {
    "overview": "/dashboard/",
    "models": "/dashboard/models",
    "energy": "/dashboard/energy",
    "carbon": "/dashboard/carbon",
    "reports": "/dashboard/reports",
    "jobs": "/dashboard/jobs",
    "settings": "/dashboard/settings",
    "settings-organization": "/dashboard/settings/organization",
    "settings-sites": "/dashboard/settings/sites",
    "settings-devices": "/dashboard/settings/devices",
    "settings-keys": "/dashboard/settings/keys",
    "settings-instruments": "/dashboard/settings/instruments",
    "settings-imports": "/dashboard/settings/imports",
    "password-change": "/accounts/password_change/",
    "member-not-found": "/dashboard/nowhere",
}
AXE = REPO_ROOT / "dashboard" / "static" / "vendor" / "axe-core" / "axe.min.js"

# Elements whose box reaches past the viewport, unless an ancestor clips or scrolls them (a wide table in its
# own scroll box is fine; the page itself must not scroll sideways).
OVERFLOWING = """() => {
  const width = document.documentElement.clientWidth;
  const clipped = (el) => {
    for (let p = el.parentElement; p && p !== document.documentElement; p = p.parentElement) {
      if (/(hidden|auto|scroll|clip)/.test(getComputedStyle(p).overflowX)) return true;
    }
    return false;
  };
  const out = [];
  for (const el of document.body.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (r.right <= width + 0.5 && r.left >= -0.5) continue;
    if (!clipped(el)) out.push(`${el.tagName.toLowerCase()}#${el.id}.${el.className} ${Math.round(r.left)}..${Math.round(r.right)}`);
  }
  if (document.documentElement.scrollWidth > width) out.push(`page scrollWidth ${document.documentElement.scrollWidth} > ${width}`);
  return out;
}"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "Debian's chromium package is needed: apt-get install chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


def _page(browser: Browser, product: str, width: int, *, signed_in: bool) -> Page:  # noqa: F811
    context = browser.new_context(base_url=product, viewport={"width": width, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.console_errors = errors  # type: ignore[attr-defined]
    if signed_in:
        page.goto("/accounts/login/")
        page.fill("#id_username", "ada")
        page.fill("#id_password", PASSWORD)
        page.click("#login-form button[type=submit]")
        page.wait_for_url("**/dashboard/")
    return page


def _every_page(browser: Browser, product: str, width: int) -> Iterator[tuple[str, Page]]:  # noqa: F811
    for signed_in, pages in ((False, ANONYMOUS_PAGES), (True, MEMBER_PAGES)):
        page = _page(browser, product, width, signed_in=signed_in)
        for name, url in pages.items():
            response = page.goto(url)
            assert response is not None and response.status in (200, 404), (url, response and response.status)
            page.wait_for_load_state("networkidle")
            yield name, page
        assert page.console_errors == [], page.console_errors  # type: ignore[attr-defined]
        page.context.close()


def test_no_page_scrolls_sideways_at_390_or_1440_px_and_each_is_kept_as_a_screenshot(
    browser: Browser,
    product: str,  # noqa: F811
) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    problems = {}
    for width in WIDTHS:
        for name, page in _every_page(browser, product, width):
            page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
            found = page.evaluate(OVERFLOWING)
            if found:
                problems[f"{name} at {width} px"] = found[:5]
    assert problems == {}


def test_axe_core_finds_no_serious_or_critical_violation_on_any_page(
    browser: Browser,
    product: str,  # noqa: F811
) -> None:
    assert AXE.exists(), "axe-core is vendored from npm into dashboard/static/vendor/axe-core/"
    problems = {}
    for name, page in _every_page(browser, product, 1440):
        serious = serious_violations(page)
        if serious:
            problems[name] = serious
    assert problems == {}


def test_the_charts_are_drawn_in_the_browser_with_tooltips_and_a_table_alternative(
    browser: Browser,
    product: str,  # noqa: F811
) -> None:
    for width in WIDTHS:
        page = _page(browser, product, width, signed_in=True)
        page.goto("/dashboard/")
        page.wait_for_selector(".chart .uplot canvas")
        charts = page.locator(".chart")
        assert charts.count() >= 2
        for i in range(charts.count()):
            chart = charts.nth(i)
            box = chart.locator("canvas").first.bounding_box()
            assert box is not None and box["x"] + box["width"] <= width  # as wide as the page allows
            table = chart.locator("details table")  # the screen readers' alternative, with the same figures
            assert table.locator("caption").count() == 1 and table.locator("tbody tr").count() >= 2
        # More than 0 and the maximum on the value axis.
        first = charts.nth(0)
        assert first.locator(".u-axis").count() >= 2
        over = first.locator(".u-over")
        over.scroll_into_view_if_needed()  # the mouse only reaches what is in the viewport
        over_box = over.bounding_box()
        assert over_box is not None
        page.mouse.move(over_box["x"] + over_box["width"] * 0.9, over_box["y"] + over_box["height"] / 2)
        tooltip = first.locator(".chart-tooltip")
        tooltip.wait_for(state="visible")
        text = tooltip.inner_text()
        assert "kWh" in text or "Wh" in text, text
        # The tooltip shows what the table shows for that day.
        day = text.splitlines()[0].strip()
        row = first.locator("details table tbody tr", has_text=day)
        assert row.count() == 1, (day, text)
        cells = row.locator("td").all_text_contents()
        assert len(cells) == 2 and all(cell and cell in text for cell in cells), (cells, text)
        assert page.console_errors == []  # type: ignore[attr-defined]
        page.context.close()


def _api_sums(page: Page, start: str, end_exclusive: str, model: str, site: str) -> dict[str, float]:
    query = f"start={start}&end={end_exclusive}&step=day&model={model}&site={site}"
    response = page.request.get(f"/api/v1/rollups?{query}")
    assert response.ok, response.text()
    rows = response.json()["results"]
    assert rows, "the filter must select some traffic"
    return {
        "requests": sum(r["requests"] for r in rows),
        "energy_kwh": sum(r["energy_kwh"] for r in rows),
        "location_co2e_g": sum(float(r["location_co2e_g"]) for r in rows),
        "market_co2e_g": sum(float(r["market_co2e_g"]) for r in rows),
    }


def test_a_range_and_filters_drive_the_page_and_show_what_the_api_returns(
    browser: Browser,
    product: str,  # noqa: F811
) -> None:
    page = _page(browser, product, 1440, signed_in=True)
    page.goto("/dashboard/")
    models = [o for o in page.locator("#id_model option").all_inner_texts() if o and o != "all models"]
    sites = page.locator("#id_site option")
    assert models and sites.count() >= 2
    today = datetime.now(UTC).date()
    first, last = today - timedelta(days=9), today - timedelta(days=2)
    page.select_option("#id_preset", "")
    page.fill("#id_start", first.isoformat())
    page.fill("#id_end", last.isoformat())
    page.select_option("#id_model", models[0])
    # The demo runs each model at some sites only: the first site where this model ran in the range.
    end_exclusive = (last + timedelta(days=1)).isoformat()
    site_value = next(
        value
        for value in (sites.nth(i).get_attribute("value") or "" for i in range(1, sites.count()))
        if page.request.get(
            f"/api/v1/rollups?start={first}&end={end_exclusive}&model={models[0]}&site={value}"
        ).json()["results"]
    )
    page.select_option("#id_site", site_value)
    page.click("#range-form button[type=submit]")
    page.wait_for_load_state("networkidle")
    assert f"model={models[0]}" in page.url and f"site={site_value}" in page.url
    # The last day is included: the API's end is the day after it.
    sums = _api_sums(page, first.isoformat(), (last + timedelta(days=1)).isoformat(), models[0], site_value)
    shown = page.locator("#range-totals")
    assert shown.locator("[data-figure=requests]").inner_text() == display.count(int(sums["requests"]))
    assert shown.locator("[data-figure=energy]").inner_text() == display.energy_kwh(sums["energy_kwh"])
    location = shown.locator("[data-figure=location]").inner_text()
    assert location == display.mass_g(sums["location_co2e_g"]) + " CO2e"
    assert (
        shown.locator("[data-figure=market]").inner_text() == display.mass_g(sums["market_co2e_g"]) + " CO2e"
    )
    # The chart's table alternative holds the same days: the range, both days included.
    days = page.locator(".chart").first.locator("details table tbody th").all_text_contents()
    assert days[0] == first.strftime("%d %b") and days[-1] == last.strftime("%d %b"), days
    # The other pages keep the range and the filters.
    page.click("nav a[href^='/dashboard/energy']")
    assert f"model={models[0]}" in page.url and f"start={first.isoformat()}" in page.url
    assert page.console_errors == []  # type: ignore[attr-defined]
    page.context.close()


def test_the_keyboard_reaches_the_content_the_navigation_and_each_charts_table(
    browser: Browser,
    product: str,  # noqa: F811
) -> None:
    page = _page(browser, product, 390, signed_in=True)
    page.goto("/dashboard/")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to the content"
    page.keyboard.press("Enter")
    assert page.url.endswith("#content")
    # Every link of the navigation and every chart's table is reached by Tab alone.
    reached: set[str] = set()
    for _ in range(80):
        page.keyboard.press("Tab")
        reached.add(page.evaluate("(e => e.getAttribute('href') || e.tagName)(document.activeElement)"))
    page.goto("/dashboard/")
    for _ in range(40):
        page.keyboard.press("Tab")
        reached.add(page.evaluate("(e => e.getAttribute('href') || e.tagName)(document.activeElement)"))
    assert {"/dashboard/models", "/dashboard/settings", "/api/docs/"} <= reached
    assert "SUMMARY" in reached
    summaries = page.locator(".chart summary")
    summaries.first.focus()
    page.keyboard.press("Enter")
    assert page.locator(".chart details").first.evaluate("d => d.open")
    page.context.close()
