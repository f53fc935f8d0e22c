"""The ISO 14064-1 elements a filed report needs beyond the totals (issue 25): methodology changes since the
previous report (from its stored snapshot), a biogenic CO2 statement, the gases reported and why only CO2e
(with the GWP source), a data-quality section, and a responsible person set per organization in the
dashboard's settings."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from carbon import display
from carbon import services as carbon
from carbon.rollups import recompute_carbon, rollups_update
from inference import limits
from reports.models import ReportingProfile
from reports.services import report_generate, report_recalculate
from tenancy.models import Device, Organization, Site
from tests.factories import OrganizationFactory
from tests.reports.conftest import CLOUD_G, KWH_UJ, OWNED_G, generate, pdf_text, section, serve
from tests.support.accounts import signed_in

pytestmark = pytest.mark.django_db
DEC = (date(2024, 12, 1), date(2025, 1, 1))


def test_methodology_changes_are_computed_from_the_previous_reports_snapshot(two_sites: Organization) -> None:
    owned = Site.objects.get(organization=two_sites, electricity="owned")
    serve(two_sites, Device.objects.get(site=owned), datetime(2024, 12, 10, 9, tzinfo=UTC), KWH_UJ, "digits")
    rollups_update()
    first = generate(two_sites, *DEC)
    assert "no previous report" in first.snapshot["statements"]["methodology_changes"]["summary"]
    # Between the two reports: a measured PUE, an hourly factor file, a new consolidation approach.
    carbon.site_set_pue(
        site=owned,
        pue="1.3",
        source="measured",
        valid_from=datetime(2025, 1, 5, tzinfo=UTC),
        relative_uncertainty="0.02",
    )
    carbon.factor_import_csv(
        data=b"zone,datetime,g_co2e_per_kwh\nFR,2025-01-10T09:00:00Z,10\n",
        name="fr-hourly.csv",
        source="RTE eco2mix hourly",
    )
    recompute_carbon(two_sites.pk)
    ReportingProfile.objects.filter(organization=two_sites).update(consolidation_approach="financial control")
    second = generate(two_sites)
    changes = second.snapshot["statements"]["methodology_changes"]
    assert changes["previous_report"]["id"] == first.pk
    listed = " ".join(changes["changes"])
    assert "RTE eco2mix hourly" in listed  # a factor source added
    assert "PUE" in listed and "1.3" in listed and "measured" in listed
    assert "operational control" in listed and "financial control" in listed
    assert "GWP" not in listed  # unchanged: not listed
    text = pdf_text(second)
    printed = section(text, "Methodology changes")
    assert f"report {first.pk}" in printed
    assert "RTE eco2mix hourly" in printed and "financial control" in printed
    # A recalculation on the same data is compared with the report it replaces: nothing changed.
    again = report_generate(report_recalculate(report=second, reason="checked again").pk)
    assert again is not None and again.status == "done"
    unchanged = again.snapshot["statements"]["methodology_changes"]
    assert unchanged["previous_report"]["id"] == second.pk
    assert unchanged["changes"] == [] and "no change" in unchanged["summary"]


def test_biogenic_co2_gases_and_gwp_are_stated(two_sites: Organization) -> None:
    report = generate(two_sites)
    statements = report.snapshot["statements"]
    assert "biogenic" in statements["biogenic_co2"].lower()
    gases = statements["gases"]
    assert gases["reported"] == "CO2e"
    assert "AR6" in gases["gwp_source"]
    assert {g["gases"] for g in gases["by_source"]} == {"CO2e"}
    assert gases["why_only_co2e"]
    text = pdf_text(report)
    assert "Biogenic CO2" in text
    printed = section(text, "Greenhouse gases")
    assert "CO2e" in printed and "AR6" in printed and "CH4" in printed and "N2O" in printed


def test_the_data_quality_section_gives_measured_and_modelled_shares_and_the_factor_matches(
    two_sites: Organization,
) -> None:
    report = generate(two_sites)
    quality = report.snapshot["results"]["data_quality"]
    # 1 kWh on the NVML-metered GPU, 0.5 kWh on the modelled CPU.
    assert abs(Decimal(quality["measured_share"]) - Decimal(2) / 3) < Decimal("0.0001")
    assert abs(Decimal(quality["modelled_share"]) - Decimal(1) / 3) < Decimal("0.0001")
    by_match = {m["match"]: m for m in quality["factor_matches"]}
    total = OWNED_G + CLOUD_G
    assert abs(float(by_match["year"]["co2e_share"]) - float(OWNED_G / total)) < 1e-4
    assert abs(float(by_match["nearest_year"]["co2e_share"]) - float(CLOUD_G / total)) < 1e-4
    printed = section(pdf_text(report), "Data quality")
    assert display.percent(2 / 3) in printed and display.percent(1 / 3) in printed
    assert display.percent(OWNED_G / total) in printed
    assert "nearest year" in printed
    assert display.percent(report.snapshot["results"]["location_based"]["relative_uncertainty"]) in printed


def test_the_responsible_person_is_set_in_the_dashboard_settings_and_printed(two_sites: Organization) -> None:
    admin = signed_in(two_sites, "admin")
    page = admin.get("/dashboard/settings").content.decode()
    assert 'name="profile-responsible_person"' in page
    saved = admin.post(
        "/dashboard/settings",
        {"action": "profile", "profile-responsible_person": "Grace Hopper, Head of ESG"},
    )
    assert saved.status_code == 302
    assert (
        ReportingProfile.objects.get(organization=two_sites).responsible_person == "Grace Hopper, Head of ESG"
    )
    report = generate(two_sites)
    text = pdf_text(report)
    assert "Responsible person: Grace Hopper, Head of ESG" in text
    assert not any("responsible person" in d.lower() for d in report.snapshot["statements"]["departures"])


def test_the_responsible_person_is_refused_past_its_limit_and_by_a_viewer() -> None:
    org = OrganizationFactory()  # no reporting profile yet: the form creates it
    assert limits.COLUMN_LIMITS[("reports", "ReportingProfile", "responsible_person")] == 200
    admin = signed_in(org, "admin")
    too_long = "x" * (limits.RESPONSIBLE_PERSON_MAX_LENGTH + 1)
    refused = admin.post("/dashboard/settings", {"action": "profile", "profile-responsible_person": too_long})
    assert refused.status_code == 200
    assert "at most 200 characters" in " ".join(refused.context["profile_form"].errors["responsible_person"])
    assert not ReportingProfile.objects.filter(organization=org, responsible_person=too_long).exists()
    assert (
        admin.post(
            "/dashboard/settings", {"action": "profile", "profile-responsible_person": "Ada"}
        ).status_code
        == 302
    )
    assert ReportingProfile.objects.get(organization=org).responsible_person == "Ada"
    viewer = signed_in(org, "viewer")
    assert (
        viewer.post(
            "/dashboard/settings", {"action": "profile", "profile-responsible_person": "Eve"}
        ).status_code
        == 403
    )
    assert ReportingProfile.objects.get(organization=org).responsible_person == "Ada"
