"""ESRS E1 datapoints (E1-5 energy consumption and mix, E1-6 gross Scopes 1, 2, 3 and totals) and the hourly
matched share, checked against the report's own totals in each file: the JSON block, esrs-e1.csv and the PDF's
text. The energy mix is recomputed here from the shipped generation-mix file, without the report's code."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from carbon import services as carbon
from carbon.services import instrument_certificates_import
from reports.models import Report
from reports.services import net_revenue_set
from tenancy.models import Organization
from tests.reports.conftest import generate, pdf_text, shows, two_site_organization

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
MIX_FILE = ROOT / "carbon" / "data" / "grid-intensity" / "owid_electricity_mix_2021_2023.csv"
CRITERIA = dict.fromkeys(
    (
        "conveys_attributes",
        "unique_claim",
        "retired_for_reporter",
        "vintage_matches_period",
        "same_market",
        "residual_mix_adjusted",
    ),
    True,
)
YEAR = (datetime(2025, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC))
# The owned French site draws 1 kWh of IT energy at 2025-01-10 09:00 UTC, at PUE 1.2: 1.2 kWh of facility
# energy. A granular GO holds 200 Wh in that hour and 300 Wh in an hour without consumption (they expire);
# an annual REC holds 300 Wh.
OWN_KWH = Decimal("1.2")
GO_CERTIFICATES = (
    b"certificate_id,production_start,production_end,energy_wh,energy_source\n"
    b"FR-GC-1,2025-01-10T09:00:00Z,2025-01-10T10:00:00Z,200,solar\n"
    b"FR-GC-2,2025-01-10T13:00:00Z,2025-01-10T14:00:00Z,300,solar\n"
)
REVENUE_EUR = Decimal("1000000")


def _instruments(org: Organization) -> None:
    go = carbon.instrument_create(
        organization=org,
        instrument_id="GO-hourly",
        kind="GO",
        zone="FR",
        vintage_start=YEAR[0],
        vintage_end=YEAR[1],
        mwh="0.0005",
        quality_criteria=CRITERIA,
    )
    instrument_certificates_import(instrument=go, data=GO_CERTIFICATES)
    carbon.instrument_create(
        organization=org,
        instrument_id="REC-annual",
        kind="REC",
        zone="FR",
        vintage_start=YEAR[0],
        vintage_end=YEAR[1],
        mwh="0.0003",
        quality_criteria=CRITERIA,
    )


@pytest.fixture
def esrs_org() -> Organization:
    org = two_site_organization()
    _instruments(org)
    net_revenue_set(organization=org, amount=REVENUE_EUR, currency="EUR", year=2025)
    return org


def _fr_mix() -> dict[str, Decimal]:
    with MIX_FILE.open(newline="", encoding="utf-8") as handle:
        row = next(r for r in csv.DictReader(handle) if r["zone"] == "FR")
    shares = {k: Decimal(row[f"{k}_share"]) for k in ("fossil", "nuclear", "renewable")}
    total = sum(shares.values(), Decimal(0))
    return {k: v / total for k, v in shares.items()}


def _datapoints(report: Report) -> dict[str, dict[str, Any]]:
    assert report.snapshot is not None
    block = report.snapshot["results"]["esrs_e1"]
    return {d["datapoint"]: d for d in block["datapoints"]}


def _value(points: dict[str, dict[str, Any]], key: str) -> Decimal:
    return Decimal(points[key]["value"])


def _category(report: Report, number: int) -> dict[str, Any]:
    assert report.snapshot is not None
    return next(
        c
        for c in report.snapshot["results"]["categories"]
        if c["category"].startswith(f"ISO 14064-1 Category {number}")
    )


def test_the_json_block_keys_each_datapoint_by_disclosure_and_paragraph_and_agrees_with_the_totals(
    esrs_org: Organization,
) -> None:
    report = generate(esrs_org)
    points = _datapoints(report)
    results = report.snapshot["results"]  # type: ignore[index]
    own, cloud = _category(report, 2), _category(report, 4)

    # E1-5: own operations only, the owned site's facility energy (PUE included), in MWh; not the cloud's.
    assert points["E1-5 §37"]["unit"] == "MWh"
    assert _value(points, "E1-5 §37") == Decimal(own["location_based"]["facility_energy_kwh"]) / 1000
    assert _value(points, "E1-5 §37") == OWN_KWH / 1000
    assert "PUE" in points["E1-5 §37"]["basis"]
    parts = [_value(points, k) for k in ("E1-5 §37(a)", "E1-5 §37(b)", "E1-5 §37(c)")]
    assert sum(parts, Decimal(0)) == _value(points, "E1-5 §37")
    assert _value(points, "E1-5 §37(c)") == _value(points, "E1-5 §37(c)(ii)")
    assert _value(points, "E1-5 §37(c)(i)") == 0 and _value(points, "E1-5 §37(c)(iii)") == 0
    # Contracted renewable energy from the instruments (200 Wh matched in its hour + 300 Wh of the REC), the
    # rest split by the zone's generation mix (location-based).
    contracted_mwh = Decimal("0.0005")
    rest_mwh = OWN_KWH / 1000 - contracted_mwh
    mix = _fr_mix()
    tolerance = Decimal("0.000000001")  # the datapoints' rounding: 1 mWh
    assert abs(_value(points, "E1-5 §37(a)") - rest_mwh * mix["fossil"]) <= tolerance
    assert abs(_value(points, "E1-5 §37(b)") - rest_mwh * mix["nuclear"]) <= tolerance
    assert (
        abs(_value(points, "E1-5 §37(c)") - (contracted_mwh + rest_mwh * mix["renewable"])) <= 2 * tolerance
    )
    shares = [
        _value(points, k) for k in ("E1-5 AR 34 (fossil)", "E1-5 AR 34 (nuclear)", "E1-5 AR 34 (renewable)")
    ]
    assert abs(sum(shares, Decimal(0)) - 100) <= Decimal("0.001")
    # Energy intensity: MWh per million EUR of net revenue, the revenue of 2025 pro-rated to January.
    revenue_m = REVENUE_EUR * 31 / 365 / 10**6
    assert abs(_value(points, "E1-5 §40") - OWN_KWH / 1000 / revenue_m) <= Decimal("0.000001")
    assert points["E1-5 §40"]["unit"] == "MWh per million EUR"
    assert "pro-rated" in points["E1-5 §40"]["basis"]

    # E1-6: Scope 2 both ways for the owned site only, Scope 3 category 1 (cloud) apart, totals both ways.
    assert _value(points, "E1-6 §48(a)") == 0
    assert points["E1-6 §49(a)"]["value"] == own["location_based"]["co2e_t"]
    assert points["E1-6 §49(b)"]["value"] == own["market_based"]["co2e_t"]
    assert points["E1-6 §51"]["value"] == cloud["location_based"]["co2e_t"]
    assert points["E1-6 §52(a)"]["value"] == results["location_based"]["co2e_t"]
    assert points["E1-6 §52(b)"]["value"] == results["market_based"]["co2e_t"]
    assert _value(points, "E1-6 §49(b)") < _value(points, "E1-6 §49(a)")  # the instruments count
    for method, total in (("location-based", "E1-6 §52(a)"), ("market-based", "E1-6 §52(b)")):
        key = f"E1-6 §53 ({method})"
        assert points[key]["unit"] == "t CO2e per million EUR"
        assert abs(_value(points, key) - _value(points, total) / revenue_m) <= Decimal("0.000001")
    for point in points.values():
        assert point["unit"] and point["label"] and point["basis"], point
        assert re.fullmatch(r"E1-[56] (§\d+(\([a-z]+\))*|AR \d+)( \([a-z -]+\))?", point["datapoint"]), point


def test_the_hourly_matched_share_stands_beside_the_annual_method_and_is_labelled_a_proposal(
    esrs_org: Organization,
) -> None:
    report = generate(esrs_org)
    matching = report.snapshot["results"]["esrs_e1"]["hourly_matching"]  # type: ignore[index]

    # Annual: 500 Wh of 1.2 kWh (the hourly GO in its own hour, the REC annually); hourly: the GO's 200 Wh.
    assert Decimal(matching["annual_share"]) == (Decimal("0.5") / OWN_KWH).quantize(Decimal("0.0001"))
    assert Decimal(matching["hourly_share"]) == (Decimal("0.2") / OWN_KWH).quantize(Decimal("0.0001"))
    assert Decimal(matching["consumption_mwh"]) == OWN_KWH / 1000
    assert Decimal(matching["matched_mwh"]) == Decimal("0.0002")
    assert matching["instruments"] == ["GO-hourly"]
    assert "not yet a standard" in matching["label"] and "Scope 2" in matching["label"]
    assert "grid" in matching["note"]  # grid carbon-free energy is not counted


def test_esrs_e1_csv_holds_the_same_datapoints_with_units_and_basis(esrs_org: Organization) -> None:
    report = generate(esrs_org)
    file = report.files.get(format="esrs-e1")

    assert file.filename.endswith("esrs-e1.csv")
    rows = list(csv.DictReader(io.StringIO(bytes(file.content).decode("utf-8"))))
    assert list(rows[0]) == ["datapoint", "label", "value", "unit", "basis"]
    points = _datapoints(report)
    assert [r["datapoint"] for r in rows] == list(points)
    for row in rows:
        point = points[row["datapoint"]]
        assert (row["label"], row["value"], row["unit"], row["basis"]) == (
            point["label"],
            point["value"],
            point["unit"],
            point["basis"],
        )
    by_key = {r["datapoint"]: r for r in rows}
    own = _category(report, 2)
    assert Decimal(by_key["E1-6 §49(a)"]["value"]) == Decimal(own["location_based"]["co2e_t"])
    assert Decimal(by_key["E1-6 §52(b)"]["value"]) == Decimal(
        report.snapshot["results"]["market_based"]["co2e_t"]  # type: ignore[index]
    )
    json_file = json.loads(bytes(report.files.get(format="json").content))
    assert (
        json_file["results"]["esrs_e1"]["datapoints"] == report.snapshot["results"]["esrs_e1"]["datapoints"]
    )  # type: ignore[index]


def test_the_pdf_prints_the_esrs_section_with_the_report_totals_and_the_mix_attribution(
    esrs_org: Organization,
) -> None:
    report = generate(esrs_org)
    text = pdf_text(report)
    esrs = text[text.rindex("ESRS E1") :]
    own, cloud = _category(report, 2), _category(report, 4)
    results = report.snapshot["results"]  # type: ignore[index]

    for key in ("E1-5 §37", "E1-5 §37(a)", "E1-5 §37(b)", "E1-5 §37(c)", "E1-6 §49(a)", "E1-6 §49(b)"):
        assert key in esrs, key
    for grams in (
        Decimal(own["location_based"]["co2e_g"]),
        Decimal(own["market_based"]["co2e_g"]),
        Decimal(cloud["location_based"]["co2e_g"]),
        Decimal(results["location_based"]["co2e_g"]),
        Decimal(results["market_based"]["co2e_g"]),
    ):
        assert shows(esrs, grams), (grams, esrs)
    assert re.search(r"1\.2 kWh", esrs)  # E1-5 §37: the owned site's facility energy, read by a person
    assert "not yet a standard" in esrs and "41.7 %" in esrs and "16.7 %" in esrs
    assert "Ember; Energy Institute; processed by Our World in Data" in esrs and "CC BY 4.0" in esrs


def test_without_net_revenue_the_intensities_are_not_reported_and_say_why() -> None:
    org = two_site_organization()

    report = generate(org)
    points = _datapoints(report)

    for key in ("E1-5 §40", "E1-6 §53 (location-based)", "E1-6 §53 (market-based)"):
        assert points[key]["value"] == "" and "no net revenue" in points[key]["basis"]
    # Own consumption, no hourly instrument: nothing is matched within the hour.
    assert Decimal(report.snapshot["results"]["esrs_e1"]["hourly_matching"]["hourly_share"]) == 0  # type: ignore[index]


def test_a_zone_without_a_generation_mix_is_counted_fossil_and_disclosed() -> None:
    org = two_site_organization()
    carbon.factor_import_csv(
        data=b"zone,datetime,g_co2e_per_kwh\nXX-TEST,2025-01-10T09:00:00Z,500\n",
        name="xx.csv",
        allow_new_zones=True,
    )
    from carbon.rollups import rollups_update
    from tenancy.models import Device
    from tests.reports.conftest import KWH_UJ, serve

    site = carbon.site_create(name=f"xx-{org.slug}", zone="XX-TEST", pue="1", organization=org)
    device = Device.objects.create(
        device_id=f"xx-{org.slug}", kind="gpu", method="rapl", measured=True, site=site
    )
    serve(org, device, datetime(2025, 1, 10, 9, tzinfo=UTC), KWH_UJ, "digits")
    rollups_update()

    report = generate(org, date(2025, 1, 1), date(2025, 2, 1))
    points = _datapoints(report)

    assert _value(points, "E1-5 §37") == (OWN_KWH + 1) / 1000
    assert _value(points, "E1-5 §37(a)") >= Decimal("0.001")  # the XX-TEST site's 1 kWh, all fossil
    assert "XX-TEST" in points["E1-5 §37(a)"]["basis"]
