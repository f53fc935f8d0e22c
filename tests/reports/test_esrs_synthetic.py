"""Synthetic data is disclosed: a report that includes synthetic records states their share of the energy in
the JSON and the PDF; one without them says nothing of the kind."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from carbon.models import HourlyRollup
from carbon.rollups import rollups_update
from demo.synthetic_ledger import generate_ledger
from tests.reports.conftest import generate, pdf_text, two_site_organization

pytestmark = pytest.mark.django_db


def test_a_report_with_synthetic_records_states_their_share_in_the_json_and_the_pdf() -> None:
    org = two_site_organization()  # real records: 1.5 kWh in January 2025
    generate_ledger(organization=org, requests=400, days=1, end=datetime(2025, 1, 25, tzinfo=UTC), seed=5)
    rollups_update()

    report = generate(org, date(2025, 1, 1), date(2025, 2, 1))

    rows = HourlyRollup.objects.filter(organization=org, hour__year=2025, hour__month=1)
    synthetic_uj = sum(r.energy_uj for r in rows if r.synthetic)
    all_uj = sum(r.energy_uj for r in rows)
    assert 0 < synthetic_uj < all_uj
    statement = report.snapshot["statements"]["synthetic_data"]  # type: ignore[index]
    assert Decimal(statement["energy_share"]) == (Decimal(synthetic_uj) / all_uj).quantize(Decimal("0.0001"))
    assert statement["requests"] == sum(r.requests for r in rows if r.synthetic)
    assert "synthetic" in statement["statement"] and "not measured" in statement["statement"]
    text = pdf_text(report)
    assert "Synthetic data" in text
    shown = f"{(Decimal(synthetic_uj) / all_uj * 100):.3g}"
    assert f"{shown} %" in text, shown


def test_a_report_without_synthetic_records_makes_no_statement_about_them() -> None:
    org = two_site_organization()

    report = generate(org)

    assert report.snapshot["statements"]["synthetic_data"] is None  # type: ignore[index]
    assert "ynthetic" not in pdf_text(report)
