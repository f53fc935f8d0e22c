"""One range of years for every stored date and every queried instant (the ledger's: 1970-2100), and an
instrument covers only the period and energy it holds: no single record can zero the market-based figure of
every period."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from carbon import co2e
from carbon import services as carbon
from carbon.intensity_csv import DEFAULT_YEARS, IntensityImportError, parse_intensity_csv
from carbon.models import ContractualInstrument, PueRecord
from carbon.rollups import rollups_update
from demo.synthetic_ledger import generate_ledger
from tenancy.models import Organization, Site
from tenancy.services import ServiceError, api_key_create, user_create
from tests.factories import OrganizationFactory
from tests.support.accounts import PASSWORD

pytestmark = pytest.mark.django_db

API = "/api/v1"
LEDGER_END = datetime(2025, 3, 1, tzinfo=UTC)
ALL_GO_CRITERIA = dict.fromkeys(co2e.RELEVANT_CRITERIA["GO"], True)
ALL_SUPPLIER_CRITERIA = dict.fromkeys(co2e.RELEVANT_CRITERIA["supplier_rate"], True)


@pytest.fixture
def org() -> Organization:
    carbon.load_shipped_factors()
    return OrganizationFactory()


def _client(org: Organization) -> APIClient:
    client = APIClient(raise_request_exception=False)
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=org, scopes='read,admin').raw_key}"
    )
    return client


def _instrument(**overrides: Any) -> dict[str, Any]:
    return {
        "instrument_id": "GO-1",
        "kind": "GO",
        "zone": "FR",
        "vintage_start": "2025-01-01T00:00:00Z",
        "vintage_end": "2026-01-01T00:00:00Z",
        "mwh": "10",
        "quality_criteria": dict(ALL_GO_CRITERIA),
        **overrides,
    }


# -- PUE records -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "valid_from", ["0001-01-01T00:00:00Z", "9999-12-31T00:00:00Z", "1969-12-31T23:00:00Z"]
)
def test_a_pue_record_outside_the_ledgers_years_is_a_400_naming_valid_from(
    org: Organization, valid_from: str
) -> None:
    client = _client(org)
    site = carbon.site_create(name="paris", zone="FR", organization=org)
    response = client.post(
        f"{API}/sites/{site.pk}/pue",
        {"pue": "1.2", "source": "measured", "valid_from": valid_from},
        format="json",
    )
    assert response.status_code == 400, response.json()
    assert "valid_from" in str(response.json()) and "1970" in str(response.json())
    assert PueRecord.objects.filter(site=site).count() == 1
    assert client.get(f"{API}/sites").status_code == 200


def test_the_service_refuses_a_pue_record_outside_the_years(org: Organization) -> None:
    site = carbon.site_create(name="paris", zone="FR", organization=org)
    with pytest.raises(ServiceError, match=r"valid_from.*1970-2100"):
        carbon.site_set_pue(site=site, pue="1.2", source="declared", valid_from=datetime(1, 1, 1, tzinfo=UTC))
    carbon.site_set_pue(site=site, pue="1.2", source="declared", valid_from=datetime(2100, 1, 1, tzinfo=UTC))


# -- instruments -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "end"),
    [
        ("0001-01-01T00:00:00Z", "9999-12-31T00:00:00Z"),
        ("9998-01-01T00:00:00Z", "9999-01-01T00:00:00Z"),
        ("1969-06-01T00:00:00Z", "1970-01-02T00:00:00Z"),
    ],
)
def test_an_instrument_vintage_outside_the_years_is_a_400_naming_the_vintage(
    org: Organization, start: str, end: str
) -> None:
    client = _client(org)
    response = client.post(
        f"{API}/instruments", _instrument(vintage_start=start, vintage_end=end), format="json"
    )
    assert response.status_code == 400, response.json()
    assert "vintage" in str(response.json())
    assert not ContractualInstrument.objects.filter(organization=org).exists()


@pytest.mark.parametrize(
    "overrides",
    [
        {"vintage_start": "2020-01-01T00:00:00Z", "vintage_end": "2030-01-01T00:00:00Z"},
        {
            "instrument_id": "SUP-ALL",
            "kind": "supplier_rate",
            "mwh": None,
            "intensity_g_per_kwh": "0",
            "vintage_start": "1970-01-01T00:00:00Z",
            "vintage_end": "2100-12-31T00:00:00Z",
            "quality_criteria": dict(ALL_SUPPLIER_CRITERIA),
        },
    ],
    ids=["certificate-of-ten-years", "unlimited-supplier-rate-of-a-century"],
)
def test_an_instrument_covering_more_than_a_year_is_refused(
    org: Organization, overrides: dict[str, Any]
) -> None:
    response = _client(org).post(f"{API}/instruments", _instrument(**overrides), format="json")
    assert response.status_code == 400, response.json()
    assert "vintage" in str(response.json()) and "year" in str(response.json())


def test_a_vintage_of_a_leap_year_is_accepted(org: Organization) -> None:
    body = _instrument(vintage_start="2024-01-01T00:00:00Z", vintage_end="2025-01-01T00:00:00Z")
    assert _client(org).post(f"{API}/instruments", body, format="json").status_code == 201


def test_the_dashboard_form_refuses_a_vintage_in_year_9999(org: Organization) -> None:
    user_create(organization=org, username="dates-admin", password=PASSWORD, role="admin")
    client = Client(raise_request_exception=False)
    assert client.login(username="dates-admin", password=PASSWORD)
    response = client.post(
        "/dashboard/settings",
        {
            "action": "instrument",
            "instrument-instrument_id": "GO-FAR",
            "instrument-kind": "GO",
            "instrument-zone": "FR",
            "instrument-vintage_start": "9999-01-01 00:00",
            "instrument-vintage_end": "9999-12-31 00:00",
            "instrument-mwh": "1",
            "instrument-intensity_g_per_kwh": "0",
            "instrument-criteria": list(ALL_GO_CRITERIA),
        },
    )
    assert response.status_code == 200
    assert "vintage_start" in response.context["instrument_form"].errors
    assert not ContractualInstrument.objects.filter(organization=org).exists()


def test_a_stored_instrument_of_a_century_does_not_zero_the_market_based_figure(org: Organization) -> None:
    """An instrument written before these checks (straight to the table) is excluded with its reason; the
    period is valued at the residual mix or grid average, not at the instrument's 0 g/kWh."""
    generate_ledger(organization=org, requests=200, days=1, end=LEDGER_END, seed=3)
    rollups_update()
    ContractualInstrument.objects.create(
        organization=org,
        instrument_id="GO-CENTURY",
        kind="GO",
        zone="FR",
        vintage_start=datetime(1970, 1, 1, tzinfo=UTC),
        vintage_end=datetime(2100, 12, 31, tzinfo=UTC),
        mwh=Decimal("9999999999"),
        intensity_g_per_kwh=Decimal(0),
        quality_criteria=dict(ALL_GO_CRITERIA),
    )
    client = _client(org)
    body = client.get(f"{API}/carbon", {"start": "2025-02-28", "end": "2025-03-01"}).json()
    scope2 = Decimal(str(body["market_based"]["by_category"]["scope2"]["co2e_g"]))
    assert scope2 > 0
    assert body["market_based"]["instruments_used"] == []
    (excluded,) = body["market_based"]["excluded"]
    assert excluded["instrument_id"] == "GO-CENTURY" and "vintage" in " ".join(excluded["reasons"])
    (listed,) = client.get(f"{API}/instruments").json()["results"]
    assert listed["usable"] is False


def test_the_core_excludes_an_instrument_whose_vintage_is_longer_than_a_year() -> None:
    consumption = co2e.Consumption(
        site_id="s",
        zone="FR",
        start=datetime(2025, 6, 1, 10, tzinfo=UTC),
        end=datetime(2025, 6, 1, 11, tzinfo=UTC),
        energy_j=Decimal(3_600_000),
        pue=Decimal(1),
        pue_relative_uncertainty=Decimal(0),
        meter_relative_uncertainty=Decimal(0),
        scope_category="scope2",
    )
    unlimited = co2e.Instrument(
        instrument_id="SUP-ALL",
        kind="supplier_rate",
        zone="FR",
        vintage_start=datetime(1970, 1, 1, tzinfo=UTC),
        vintage_end=datetime(2100, 1, 1, tzinfo=UTC),
        mwh=None,
        intensity_g_per_kwh=Decimal(0),
        quality_criteria=dict(ALL_SUPPLIER_CRITERIA),
    )
    mix = co2e.ResidualMix(zone="FR", year=2025, intensity_g_per_kwh=Decimal(60), source="test")
    result = co2e.market_based([consumption], [unlimited], [mix], [])
    assert result.total.co2e_g == Decimal(60)
    assert [e.instrument.instrument_id for e in result.excluded] == ["SUP-ALL"]
    assert any("vintage" in reason for reason in result.excluded[0].reasons)


# -- one range everywhere --------------------------------------------------------------------------


def test_residual_mix_years_end_with_the_same_range(org: Organization) -> None:
    client = _client(org)
    body = {"zone": "FR", "intensity_g_per_kwh": "60", "source": "AIB"}
    assert client.post(f"{API}/residual-mixes", {**body, "year": 1989}, format="json").status_code == 400
    assert client.post(f"{API}/residual-mixes", {**body, "year": 2100}, format="json").status_code == 201
    assert client.post(f"{API}/residual-mixes", {**body, "year": 2101}, format="json").status_code == 400
    with pytest.raises(ServiceError, match="2100"):
        carbon.residual_mix_create(
            zone="FR", year=2101, intensity_g_per_kwh="60", source="AIB", organization=org
        )


def test_a_report_period_outside_the_years_is_a_400_naming_it(org: Organization) -> None:
    client = APIClient(raise_request_exception=False)
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=org, scopes='read,admin').raw_key}"
    )
    response = client.post(f"{API}/reports", {"start": "0001-01-01", "end": "0001-02-01"}, format="json")
    assert response.status_code == 400, response.json()
    assert "start" in response.json() and "1970" in str(response.json())


def test_ledger_queries_use_the_same_range(org: Organization) -> None:
    client = _client(org)
    assert client.get(f"{API}/ledger/requests", {"start": "1969-12-31T00:00:00Z"}).status_code == 400
    assert client.get(f"{API}/ledger/requests", {"start": "1970-01-01T00:00:00Z"}).status_code == 200


def test_factor_files_use_the_same_range(org: Organization) -> None:
    assert DEFAULT_YEARS == (co2e.FIRST_YEAR, co2e.LAST_YEAR)  # the parser alone imports no project module
    record = carbon.factor_import_csv(
        data=b"zone,datetime,g_co2e_per_kwh\nFR,1969-03-01T13:00:00Z,50\n", name="old.csv", organization=org
    )
    assert record.status == "rejected" and "1970" in record.errors[0]["reason"]
    with pytest.raises(IntensityImportError, match="1970"):
        parse_intensity_csv("zone,datetime,g_co2e_per_kwh\nFR,1969-03-01T13:00:00Z,50\n")
    parsed = parse_intensity_csv("zone,datetime,g_co2e_per_kwh\nFR,1970-03-01T13:00:00Z,50\n")
    assert parsed.rows[0].period_start.year == 1970


def test_every_site_created_starts_its_pue_history_inside_the_range(org: Organization) -> None:
    site = carbon.site_create(name="lyon", zone="FR", organization=org)
    first = PueRecord.objects.filter(site=Site.objects.get(pk=site.pk)).get()
    assert first.valid_from.year == co2e.FIRST_YEAR
