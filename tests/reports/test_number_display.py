"""Numbers people read go through the one formatter (carbon/display.py), in the PDF and on the dashboard; the
CSV and JSON keep full precision (issue 25)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.db.models import Sum

from carbon import display
from carbon.models import HourlyRollup
from tests.reports.conftest import generate, pdf_text, two_site_organization
from tests.support.accounts import signed_in

pytestmark = pytest.mark.django_db
TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
# A number in E-notation ("1.2e-05"), not hex digits of a hash or a colour ("5e4" in "a75e4c...").
E_NOTATION = re.compile(r"(?<![\w.#])\d+(?:\.\d+)?[eE][+-]?\d+(?![\w.])")


def _page_text(html: str) -> str:
    """What a person reads on a page: no style sheet, no script, no tags."""
    html = re.sub(r"<(style|script)\b.*?</\1>", " ", html, flags=re.S)
    return re.sub(r"<[^>]+>", " ", html)


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
    overview = _page_text(client.get("/dashboard/").content.decode())
    # All the traffic is in the last hour: every window of the overview holds all of it.
    totals = HourlyRollup.objects.filter(organization=org).aggregate(
        uj=Sum("energy_uj"), g=Sum("location_co2e_g")
    )
    assert display.energy_kwh(Decimal(totals["uj"]) / Decimal(3_600_000 * 10**6)) in overview
    assert display.mass_g(totals["g"]) in overview
    assert not E_NOTATION.search(overview)
    energy = client.get("/dashboard/energy").content.decode()
    assert " Wh" in energy or " kWh" in energy
