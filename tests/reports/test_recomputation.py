"""The report's figures recomputed without any of the product's carbon code: plain fractions from the ledger's
rows (each request's share of its batch's energy) and the shipped factor files read with the csv module, then
compared with the snapshot, the CSV and what the PDF prints for each category (issue 25)."""

from __future__ import annotations

import csv
import itertools
import json
from collections import defaultdict
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from carbon import services as carbon
from carbon.rollups import rollups_update
from ledger.models import LedgerBatchEnergy, LedgerRequest
from ledger.writer import append_records
from tenancy.models import Device, Organization
from tests.factories import OrganizationFactory
from tests.reports.conftest import KWH_UJ, QUANTITY, UNIT_G, generate, pdf_text, section
from tests.support.ledger import one_request_records

pytestmark = pytest.mark.django_db
FACTORS = Path(__file__).resolve().parents[2] / "carbon" / "data" / "grid-intensity"
YEAR = 2025
PUE_CHANGE = datetime(2025, 1, 15, tzinfo=UTC)
# (site, hour of the request, IT energy in µJ)
SERVED = (
    ("paris", datetime(2025, 1, 10, 9, tzinfo=UTC), 7 * KWH_UJ // 10),
    ("paris", datetime(2025, 1, 20, 10, tzinfo=UTC), 4 * KWH_UJ // 10 + 123_456),
    ("berlin", datetime(2025, 1, 5, 8, tzinfo=UTC), 8 * KWH_UJ // 10),
    ("virginia", datetime(2025, 1, 20, 16, tzinfo=UTC), KWH_UJ // 2),
    ("virginia", datetime(2025, 1, 25, 3, tzinfo=UTC), KWH_UJ // 4 + 7),
)
SITES = {  # name: (zone, electricity, PUE before the change, PUE from the change on)
    "paris": ("FR", "owned", Fraction("1.2"), Fraction("1.3")),
    "berlin": ("DE", "colocated", Fraction("1.4"), Fraction("1.4")),
    "virginia": ("US-VA", "cloud", Fraction("1.1"), Fraction("1.1")),
}


def _state() -> Organization:
    carbon.load_shipped_factors()
    org = OrganizationFactory(name="Recomputed Inference")
    devices = {}
    for name, (zone, electricity, pue, later) in SITES.items():
        site = carbon.site_create(
            name=name,
            zone=zone,
            pue=str(pue.numerator / pue.denominator),
            electricity=electricity,
            organization=org,
        )
        if later != pue:
            carbon.site_set_pue(
                site=site,
                pue=str(later.numerator / later.denominator),
                source="measured",
                valid_from=PUE_CHANGE,
            )
        devices[name] = Device.objects.create(
            device_id=f"dev-{name}",
            kind="cpu",
            method="rapl",
            measured=True,
            relative_uncertainty=0.1,
            site=site,
        )
    numbers = itertools.count(1)
    records: list[dict[str, object]] = []
    for name, hour, energy_uj in SERVED:
        t_ns = int(hour.timestamp()) * 10**9 + 5 * 60 * 10**9
        records += one_request_records(
            "rc", next(numbers), org.pk, devices[name].device_id, t_ns, energy_uj, "digits"
        )
    append_records("recomputation", records)
    rollups_update()
    return org


def _factor(zone: str) -> Fraction:
    """The zone's annual intensity for YEAR from the shipped files, else the nearest year's (g CO2e/kWh)."""
    rows = []
    for path in sorted(FACTORS.glob("*.csv")):
        with path.open(newline="") as handle:
            rows += [r for r in csv.DictReader(handle) if r["zone"] == zone and "gco2e_per_kwh" in r]
    best = min(rows, key=lambda r: (abs(int(r["year"]) - YEAR), -int(r["year"])))
    return Fraction(best["gco2e_per_kwh"])


def _expected(org: Organization) -> dict[str, dict[str, Fraction]]:
    """Facility kWh and g CO2e per category, from the ledger's rows and the factor files alone."""
    requests = {r.request_id: r for r in LedgerRequest.objects.filter(organization=org)}
    site_of = {f"dev-{name}": name for name in SITES}
    out: dict[str, dict[str, Fraction]] = defaultdict(lambda: {"kwh": Fraction(0), "g": Fraction(0)})
    for row in LedgerBatchEnergy.objects.all():
        for request_id, share_uj in zip(json.loads(row.request_ids), json.loads(row.shares_uj), strict=True):
            request = requests.get(request_id)
            if request is None:
                continue
            name = site_of[request.device_id]
            zone, electricity, pue, later = SITES[name]
            at = datetime.fromtimestamp(request.started_ns // 10**9, UTC)
            facility_kwh = Fraction(share_uj, 10**6) / 3_600_000 * (later if at >= PUE_CHANGE else pue)
            category = "scope3_cat1" if electricity == "cloud" else "scope2"
            out[category]["kwh"] += facility_kwh
            out[category]["g"] += facility_kwh * _factor(zone)
    return out


def _close(printed: str, expected: Fraction, quantum: Fraction) -> bool:
    return abs(Fraction(Decimal(printed)) - expected) <= quantum / 2


def test_the_report_agrees_with_a_recomputation_from_the_ledger_and_the_factor_files() -> None:
    org = _state()
    expected = _expected(org)
    report = generate(org)
    scopes = report.snapshot["results"]["scopes"]
    g = Fraction(1, 1000)  # the snapshot's grams: 0.001 g
    for category in ("scope2", "scope3_cat1"):
        for method in (
            "location_based",
            "market_based",
        ):  # no instrument, no residual mix: both at the grid average
            assert _close(scopes[category][method]["co2e_g"], expected[category]["g"], g), (category, method)
        assert _close(
            scopes[category]["location_based"]["facility_energy_kwh"],
            expected[category]["kwh"],
            Fraction(1, 10**6),
        )
    total = expected["scope2"]["g"] + expected["scope3_cat1"]["g"]
    assert _close(report.snapshot["results"]["location_based"]["co2e_g"], total, g)
    rows = list(csv.DictReader(bytes(report.files.get(format="csv").content).decode().splitlines()))
    for category, iso in (("scope2", "Category 2"), ("scope3_cat1", "Category 4")):
        summed = sum(
            Fraction(r["co2e (g)"])
            for r in rows
            if r["scope2_method (location|market)"] == "location" and iso in r["iso_14064_category"]
        )
        assert abs(summed - expected[category]["g"]) <= g * len(rows)
    text = pdf_text(report)
    scope2 = section(text, "Scope 2: owned and colocated sites")
    scope3 = section(text, "Scope 3 category 1: cloud inference")
    # What a person reads, within half a unit of the last digit printed.
    assert _printed(scope2, expected["scope2"]["g"]), scope2
    assert _printed(scope3, expected["scope3_cat1"]["g"]), scope3
    assert _printed(section(text, "Emissions by category"), total)


def _printed(text: str, grams: Fraction) -> bool:
    """Whether ``text`` prints ``grams`` rounded to the digits it shows (in g, kg or t)."""
    for number, unit in QUANTITY.findall(text):
        digits = number.replace(",", "")
        quantum = Fraction(1, 10 ** len(digits.partition(".")[2])) * Fraction(UNIT_G[unit])
        if abs(Fraction(digits) * Fraction(UNIT_G[unit]) - grams) <= quantum / 2:
            return True
    return False
