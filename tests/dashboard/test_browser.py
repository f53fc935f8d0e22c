"""The dashboard in a real browser: Debian's Chromium, headless, driven by Playwright, against the product's
own server and a real Celery worker. Screenshots of every page go to test-artifacts/screenshots/."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.sync_api import Page, sync_playwright

from tests.support.gateway_process import REPO_ROOT, GatewayProcess, gateway_env, manage, prepare_gateway

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = REPO_ROOT / "test-artifacts" / "screenshots"
PASSWORD = "a-long-test-password-42"
PAGES = ("", "models", "energy", "carbon", "reports", "jobs", "settings", "settings/sites", "settings/keys")


@pytest.fixture(scope="module")
def product(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server (manage.py serve) and a Celery worker over a fresh SQLite file with a demo ledger."""
    tmp = tmp_path_factory.mktemp("browser")
    env = gateway_env(
        tmp, f"sqlite:///{tmp / 'db.sqlite3'}", LEDGER_WRITER="thread", CARBONLEDGER_PASSWORD=PASSWORD
    )
    prepare_gateway(env)
    for args in (
        ("load_demo_ledger", "--org", "acme", "--requests", "20000", "--days", "30"),
        ("create_user", "acme", "ada", "--role", "admin"),
    ):
        done = manage(env, *args)
        assert done.returncode == 0, done.stderr[-2000:]
    server = GatewayProcess(env, tmp / "server.log").start()
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "carbonledger", "worker", "--pool=solo", "--loglevel=INFO"],
        cwd=REPO_ROOT,
        env=env,
        stdout=open(tmp / "worker.log", "wb"),  # noqa: SIM115 -- closed with the process
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(20)
        server.terminate()


@pytest.fixture
def page(product: str) -> Iterator[Page]:
    assert Path(CHROMIUM).exists(), (
        "Debian's chromium package is needed: apt-get install chromium (make test does)"
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(
            base_url=product, accept_downloads=True, viewport={"width": 1280, "height": 900}
        )
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.console_errors = errors  # type: ignore[attr-defined]
        page.goto("/accounts/login/")
        page.fill("#id_username", "ada")
        page.fill("#id_password", PASSWORD)
        page.click("#login-form button")
        page.wait_for_url("**/dashboard/")
        yield page
        browser.close()


def test_every_page_opens_without_a_console_error_and_is_kept_as_a_screenshot(page: Page) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for name in PAGES:
        response = page.goto(f"/dashboard/{name}")
        assert response is not None and response.status == 200, name
        page.wait_for_load_state("networkidle")
        page.screenshot(
            path=str(SCREENSHOTS / f"{(name or 'overview').replace('/', '-')}.png"), full_page=True
        )
    assert page.console_errors == []  # type: ignore[attr-defined]


def test_the_overview_shows_the_demo_ledger(page: Page) -> None:
    text = page.inner_text("main")
    assert "This month" in text and "CO2e" in text
    page.wait_for_selector(".chart .uplot canvas")  # the trend charts, drawn in the browser
    assert page.locator(".chart details table tbody tr").count() > 10  # and their figures as tables
    footer = page.inner_text("footer")
    assert "Ember" in footer and "CC BY 4.0" in footer  # the factors' attribution


def test_a_report_is_requested_watched_and_its_pdf_downloaded(page: Page, tmp_path: Path) -> None:
    page.goto("/dashboard/reports")
    page.fill("#id_start", "2020-01-01")
    page.fill("#id_end", "2030-01-01")
    page.click("#report-form button")
    page.wait_for_url("**/dashboard/reports")
    page.wait_for_selector("tr[data-status=done] .files a", timeout=90_000)
    with page.expect_download() as info:
        page.click("tr[data-status=done] .files a:text('PDF')")
    path = tmp_path / "report.pdf"
    info.value.save_as(path)
    assert path.read_bytes()[:5] == b"%PDF-"
    page.screenshot(path=str(SCREENSHOTS / "reports-done.png"), full_page=True)
    assert page.console_errors == []  # type: ignore[attr-defined]


def test_a_settings_form_rejects_bad_input_next_to_the_field(page: Page) -> None:
    page.goto("/dashboard/settings/sites")
    page.fill("#id_site-name", "paris-2")
    page.fill("#id_site-zone", "XX-NOWHERE")
    page.fill("#id_site-pue", "1.3")
    page.click("#site-form button")
    # The server's refusal, next to the zone field (the error list right before its input).
    beside = page.locator("#id_site-zone").locator("xpath=preceding::ul[contains(@class, 'errorlist')][1]")
    assert "unknown grid zone 'XX-NOWHERE'" in beside.inner_text()
    # A PUE below 1 is stopped in the browser already, with the field's own message.
    page.fill("#id_site-zone", "FR")
    page.fill("#id_site-pue", "0.5")
    page.click("#site-form button")
    assert page.eval_on_selector("#id_site-pue", "e => e.validationMessage")
    page.screenshot(path=str(SCREENSHOTS / "settings-error.png"), full_page=True)


def test_a_job_is_submitted_from_the_form_and_its_window_shown(page: Page, tmp_path: Path) -> None:
    x = ",".join(str((i % 7) / 7) for i in range(256))
    line = '{"inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": [' + x + "]}]}"
    upload = tmp_path / "two.jsonl"
    upload.write_text(line + "\n" + line + "\n")
    page.goto("/dashboard/jobs")
    page.set_input_files("#id_file", str(upload))
    page.fill("#id_model", "linear")
    deadline = datetime.now(UTC) + timedelta(hours=3)
    page.fill("#id_deadline", deadline.strftime("%Y-%m-%d %H:%M"))
    page.click("#job-form button")
    page.wait_for_load_state()
    assert "/dashboard/jobs/" in page.url, page.inner_text("#job-form")
    assert "linear" in page.inner_text("h1")
    window = page.inner_text("#job-window")
    assert "Planned start" in window and "g CO2e/kWh" in window
    assert "of 2 requests answered" in page.inner_text("#job-status")
    page.screenshot(path=str(SCREENSHOTS / "job.png"), full_page=True)
    # A deadline in the past is refused next to the form, with the service's reason.
    page.goto("/dashboard/jobs")
    page.set_input_files("#id_file", str(upload))
    page.fill("#id_model", "linear")
    page.fill("#id_deadline", "2001-01-01 00:00")
    page.click("#job-form button")
    assert page.inner_text("#job-form").count("is in the past") == 1
    page.screenshot(path=str(SCREENSHOTS / "jobs-error.png"), full_page=True)
    assert page.console_errors == []  # type: ignore[attr-defined]
