"""Section 11 of the PDF summarises an hourly factor series per zone, source and version (hours covered,
lowest, mean and highest intensity, the version's file hash) instead of one row per hour, so a month of
hourly factors keeps the report short; the JSON keeps every factor, hour by hour (issue 25 follow-up)."""

from __future__ import annotations

import io
from datetime import UTC, date, datetime
from decimal import Decimal

import pypdf
import pytest

from carbon import display
from carbon.services import load_shipped_factors
from demo.showcase import load_demo
from tests.factories import OrganizationFactory
from tests.reports.conftest import generate, pdf_bytes, pdf_text, section

pytestmark = pytest.mark.django_db

# A month's report of the demo: a synthetic hourly series for each zone, 29 days of traffic.
FEB = (date(2025, 2, 1), date(2025, 3, 1))


def test_a_month_of_hourly_factors_is_summarised_per_series_and_keeps_the_pdf_short() -> None:
    org = OrganizationFactory(name="Demo Month")
    load_shipped_factors()
    load_demo(organization=org, days=28, end=datetime(2025, 3, 1, tzinfo=UTC))

    report = generate(org, *FEB)

    factors = report.snapshot["inputs"]["factors"]  # type: ignore[index]
    hourly = [f for f in factors if f["granularity"] == "hour"]
    assert len(hourly) > 1000  # the JSON keeps every hourly factor used
    pages = len(pypdf.PdfReader(io.BytesIO(pdf_bytes(report))).pages)
    assert pages < 25, pages
    text = pdf_text(report)
    table = section(text, "11. Emission factors")
    # Every source used is still named, and each series is summarised by its hours and its range.
    for source in {f["source"] for f in factors}:
        assert " ".join(source.split()) in text, source
    series: dict[tuple[str, int], list[Decimal]] = {}
    for f in hourly:
        series.setdefault((f["zone"], f["version"]), []).append(Decimal(f["intensity_g_per_kwh"]))
    for (zone, _), values in series.items():
        assert zone in table
        assert f"{display.count(len(values))} h" in table, (zone, len(values))
        assert display.number(min(values)) in table and display.number(max(values)) in table
        mean = sum(values) / len(values)
        assert display.number(mean) in table
    for f in hourly:
        assert f["version_sha256"][:16] in table
    # No hour of a series gets its own row any more: only a series' first and last hours are printed.
    second_hour = sorted({f["period_start"] for f in hourly})[1]
    assert f"{second_hour[:10]} {second_hour[11:16]}" not in table
