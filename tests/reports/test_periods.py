"""Periods are inclusive wherever people read or enter them ("1-30 November 2026", an en dash): the report form, the
dashboard's list and the PDF. Only the API and the stored report keep the exclusive end (issue 25)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from django.utils import timezone

from dashboard.forms import ReportForm
from reports.models import Report
from reports.services import report_generate
from tests.reports.conftest import pdf_text, two_site_organization
from tests.support.accounts import signed_in

pytestmark = pytest.mark.django_db
DASH = "\N{EN DASH}"


def test_a_user_who_enters_1_to_30_november_gets_30_november_included() -> None:
    org = two_site_organization(
        when=(datetime(2026, 11, 30, 9, tzinfo=UTC), datetime(2026, 11, 30, 23, tzinfo=UTC))
    )
    client = signed_in(org, "analyst")
    page = client.get("/dashboard/reports").content.decode()
    assert "Last day" in page and "exclusive" not in page
    response = client.post("/dashboard/reports", {"start": "2026-11-01", "end": "2026-11-30"})
    assert response.status_code == 302, response.content.decode()[-2000:]
    report = Report.objects.get(organization=org)
    assert (report.period_start, report.period_end) == (date(2026, 11, 1), date(2026, 12, 1))
    done = report_generate(report.pk)
    assert done is not None and done.status == "done", done and done.failure_reason
    assert done.snapshot["results"]["requests"] == 2  # both were served on 30 November
    text = pdf_text(done)
    assert f"1{DASH}30 November 2026" in text
    assert "exclusive" not in text and "2026-12-01" not in text
    listed = client.get("/dashboard/reports").content.decode()
    assert f"1{DASH}30 November 2026" in listed


def test_the_json_keeps_the_exclusive_end_and_names_the_last_day() -> None:
    org = two_site_organization()
    client = signed_in(org, "analyst")
    client.post("/dashboard/reports", {"start": "2025-01-01", "end": "2025-01-31"})
    report = report_generate(Report.objects.get(organization=org).pk)
    assert report is not None
    assert report.snapshot["period"] == {
        "start": "2025-01-01",
        "end_exclusive": "2025-02-01",
        "last_day": "2025-01-31",
        "label": f"1{DASH}31 January 2025",
    }


@pytest.mark.parametrize(
    ("preset", "today", "first", "last"),
    [
        ("last_month", date(2026, 12, 6), date(2026, 11, 1), date(2026, 11, 30)),
        ("last_month", date(2026, 1, 15), date(2025, 12, 1), date(2025, 12, 31)),
        ("last_quarter", date(2026, 12, 6), date(2026, 7, 1), date(2026, 9, 30)),
        ("last_quarter", date(2026, 2, 28), date(2025, 10, 1), date(2025, 12, 31)),
        ("year_to_date", date(2026, 12, 6), date(2026, 1, 1), date(2026, 12, 6)),
        ("last_year", date(2026, 12, 6), date(2025, 1, 1), date(2025, 12, 31)),
    ],
)
def test_the_report_form_presets(preset: str, today: date, first: date, last: date) -> None:
    form = ReportForm({"preset": preset}, today=today)
    assert form.is_valid(), form.errors
    assert (form.cleaned_data["start"], form.cleaned_data["end"]) == (first, last)
    assert form.cleaned_data["end_exclusive"] == last + timedelta(days=1)


def test_a_preset_posted_from_the_dashboard_requests_that_period() -> None:
    org = two_site_organization()
    client = signed_in(org, "analyst")
    assert 'value="last_quarter"' in client.get("/dashboard/reports").content.decode()
    assert client.post("/dashboard/reports", {"preset": "last_month"}).status_code == 302
    today = timezone.now().astimezone(UTC).date()
    this_month = today.replace(day=1)
    report = Report.objects.get(organization=org)
    assert (report.period_start, report.period_end) == (
        (this_month - timedelta(days=1)).replace(day=1),
        this_month,
    )


def test_a_custom_period_needs_both_days_in_order() -> None:
    assert not ReportForm({"start": "2025-01-31", "end": "2025-01-01"}).is_valid()
    missing = ReportForm({"start": "2025-01-01"})
    assert not missing.is_valid() and "end" in missing.errors
    one_day = ReportForm({"start": "2025-01-31", "end": "2025-01-31"})
    assert one_day.is_valid(), one_day.errors
    assert one_day.cleaned_data["end_exclusive"] == date(2025, 2, 1)
