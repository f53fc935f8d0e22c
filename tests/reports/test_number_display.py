"""Numbers people read go through the one formatter (carbon/display.py), in the PDF and on the dashboard; the
CSV and JSON keep full precision (issue 25)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone

from carbon import display
from dashboard import selectors
from tests.reports.conftest import generate, pdf_text, two_site_organization
from tests.support.accounts import signed_in

pytestmark = pytest.mark.django_db
TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
E_NOTATION = re.compile(r"\d[eE][+-]?\d")


@pytest.mark.parametrize("folder", ["dashboard", "reports"])
def test_no_template_formats_a_number_on_its_own(folder: str) -> None:
    for template in sorted((TEMPLATES / folder).glob("*.html")):
        source = template.read_text()
        for own in ("floatformat", "widthratio", "stringformat"):
            assert own not in source, f"{template.name} formats numbers with {own}, not the one formatter"


def test_the_pdf_prints_figures_with_units_by_magnitude_and_uncertainty_in_the_same_unit(two_sites) -> None:
    report = generate(two_sites)
    results = report.snapshot["results"]
    text = pdf_text(report)
    total = results["location_based"]
    assert display.mass_g_pm(total["co2e_g"], total["uncertainty_g"]) in text
    assert display.energy_kwh(results["energy"]["it_energy_kwh"]) in text
    assert "Significance threshold: 5 %" in text
    assert not re.search(r"\d\.\d*0 %", text), "a percentage with trailing zeros"
    assert not E_NOTATION.search(text)
    assert not re.search(r"\d\.\d{7,}", text), "a figure with seven or more decimals"
    # Full precision stays in the files meant for machines.
    assert Decimal(results["location_based"]["co2e_g"]) == Decimal("184.345")
    csv = bytes(report.files.get(format="csv").content).decode()
    assert "49.728" in csv and "134.617" in csv


def test_the_dashboard_prints_figures_through_the_formatter() -> None:
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    org = two_site_organization(when=(now - timedelta(hours=1), now - timedelta(hours=1)))
    client = signed_in(org, "viewer")
    overview = client.get("/dashboard/").content.decode()
    window = selectors.overview(org.pk, timezone.now())["windows"]["this year"]
    assert display.energy_kwh(window["energy_kwh"]) in overview
    assert display.mass_g(window["location_t"] * 1_000_000) in overview
    assert not E_NOTATION.search(overview.split("<svg")[0])
    energy = client.get("/dashboard/energy").content.decode()
    assert " Wh" in energy or " kWh" in energy
