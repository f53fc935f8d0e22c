"""Carbon accounting fixes: PUE changes recompute every organization at the site, embodied emissions per
device, rows that cannot be valued, period and cursor bounds, earlier rows kept out of the summary,
market-based errors cleared, provider fetches stored once, decimal bounds, site names per organization."""

from __future__ import annotations

import base64
import itertools
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from api import carbon as carbon_api
from carbon import co2e, tasks
from carbon import services as carbon
from carbon.models import ContractualInstrument, EmissionFactor, FactorImport, HourlyRollup
from carbon.providers import ProviderReading
from carbon.rollups import market_recompute, recompute_carbon, rollups_update
from carbon.selectors import carbon_summary, factor_set
from ledger.writer import append_records, default_site
from tenancy.models import Device, Organization, Site
from tenancy.services import ServiceError, api_key_create, user_create
from tests.factories import OrganizationFactory
from tests.support.ledger import one_request_records

# Not transactional: the on-commit hooks (Celery recomputes) never fire unless a test captures them.
pytestmark = pytest.mark.django_db

API = "/api/v1"
PASSWORD = "a-long-test-password-42"
JAN = datetime(2025, 1, 15, 10, tzinfo=UTC)
FEB = datetime(2025, 2, 24, 10, tzinfo=UTC)
KWH_UJ = 3_600_000_000_000  # 1 kWh of IT energy
FR_2025 = Decimal("41.44")  # Ember 2025, France (the shipped annual figure)
ALL_CRITERIA = dict.fromkeys(
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
_ids = itertools.count(1)


@pytest.fixture
def factors() -> None:
    carbon.load_shipped_factors()


def _site(org: Organization | None, zone: str = "FR", pue: str = "1.2", name: str = "") -> Site:
    return carbon.site_create(
        name=name or f"site-{next(_ids)}",
        zone=zone,
        pue=pue,
        organization=org,
        pue_relative_uncertainty="0.02",
    )


def _device(site: Site, device_id: str = "") -> Device:
    return Device.objects.create(
        device_id=device_id or f"gpu-{next(_ids)}",
        kind="gpu",
        method="nvml-counter",
        measured=True,
        relative_uncertainty=0.05,
        site=site,
    )


def _request(org: Organization, device: Device, at: datetime, energy_uj: int = KWH_UJ) -> None:
    """Append one batch with one request of ``org`` and its whole energy part to the ledger."""
    n = next(_ids)
    t = int(at.timestamp()) * 1_000_000_000
    append_records("fixes", one_request_records("f", n, org.pk, device.device_id, t, energy_uj))


def _row(org: Organization, at: datetime, site: Site | None = None) -> HourlyRollup:
    rows = HourlyRollup.objects.filter(organization=org, hour=at)
    if site is not None:
        rows = rows.filter(site=site)
    return rows.get()


def _client(org: Organization, *, raise_errors: bool = False) -> APIClient:
    client = APIClient(raise_request_exception=raise_errors)
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=org, scopes='read,admin').raw_key}"
    )
    return client


# -- 1. a new PUE record recomputes every organization with requests at the site -----------------------


def test_a_pue_record_recomputes_the_rollups_of_every_organization_at_the_site(
    factors: None, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    operator, tenant = OrganizationFactory(), OrganizationFactory()
    site = _site(operator, pue="1.2")
    device = _device(site)
    _request(tenant, device, JAN)
    _request(tenant, device, FEB)
    _request(operator, device, FEB)
    rollups_update()
    assert _row(tenant, FEB).location_co2e_g == Decimal("1.2") * FR_2025

    queued: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    monkeypatch.setattr(tasks.recompute_carbon, "delay", lambda *a, **kw: queued.append((a, kw)))
    with django_capture_on_commit_callbacks(execute=True):
        carbon.site_set_pue(
            site=site, pue="1.5", source="measured", valid_from=datetime(2025, 2, 1, 0, 30, tzinfo=UTC)
        )
    # Narrowed to the site from the record's hour, for every organization (None), not only the operator.
    assert queued == [((None,), {"site_id": site.pk, "start": "2025-02-01T00:00:00+00:00"})]
    for args, kwargs in queued:  # what the worker does with the message
        tasks.recompute_carbon(*args, **kwargs)

    jan, feb = _row(tenant, JAN), _row(tenant, FEB)
    assert (jan.pue, jan.location_co2e_g) == (Decimal("1.200"), Decimal("1.2") * FR_2025)
    assert feb.pue == Decimal("1.500")
    assert feb.location_co2e_g == Decimal("62.16")  # 1.5 x 41.44, was 49.728
    assert feb.market_co2e_g == Decimal("62.16")  # no instrument: the grid average
    assert _row(operator, FEB).location_co2e_g == Decimal("62.16")


def test_a_recompute_narrowed_to_a_site_leaves_other_sites_alone_and_uses_instruments_in_order(
    factors: None,
) -> None:
    operator, tenant = OrganizationFactory(), OrganizationFactory()
    site, other = _site(operator, pue="1.2"), _site(tenant, pue="1.2")
    device, elsewhere = _device(site), _device(other)
    # 1.2 kWh of facility energy in January uses the whole certificate; February's rows get none of it.
    carbon.instrument_create(
        organization=tenant,
        instrument_id="GO-1",
        kind="GO",
        zone="FR",
        vintage_start=datetime(2025, 1, 1, tzinfo=UTC),
        vintage_end=datetime(2026, 1, 1, tzinfo=UTC),
        mwh="0.0012",
        quality_criteria=dict(ALL_CRITERIA),
    )
    _request(tenant, device, JAN)
    _request(tenant, device, FEB)
    _request(tenant, elsewhere, FEB)
    rollups_update()
    assert _row(tenant, JAN).market_co2e_g == 0
    untouched_other = _row(tenant, FEB, other)
    # New records at both sites; only the site's own recompute runs (the hooks never fire here).
    valid_from = datetime(2025, 2, 1, tzinfo=UTC)
    carbon.site_set_pue(site=site, pue="1.5", source="measured", valid_from=valid_from)
    carbon.site_set_pue(site=other, pue="1.5", source="measured", valid_from=valid_from)

    recomputed = recompute_carbon(None, site_id=site.pk, start=valid_from)

    assert recomputed == 1
    feb = _row(tenant, FEB, site)
    assert (feb.pue, feb.location_co2e_g) == (Decimal("1.500"), Decimal("62.16"))
    # The market-based figure is recomputed too, with the certificate spent in January (not used again).
    assert feb.market_co2e_g == Decimal("62.16")
    assert _row(tenant, JAN).market_co2e_g == 0
    other_after = _row(tenant, FEB, other)
    assert (other_after.pue, other_after.location_co2e_g) == (
        untouched_other.pue,
        untouched_other.location_co2e_g,
    )
    assert other_after.pue == Decimal("1.200")


# -- 2. embodied emissions: the hours of each device only --------------------------------------------


def test_embodied_emissions_count_each_device_s_own_hours_not_every_hour_of_its_site(factors: None) -> None:
    org = OrganizationFactory()
    site = _site(org, pue="1")
    first, second, unused = _device(site), _device(site), _device(site)
    carbon.device_update(device=first, embodied_kg_co2e="876", lifetime_years="1")
    carbon.device_update(device=second, embodied_kg_co2e="1752", lifetime_years="2.5")
    carbon.device_update(device=unused, embodied_kg_co2e="5000", lifetime_years="3")
    _request(org, first, JAN)
    _request(org, first, JAN + timedelta(hours=1))
    _request(org, second, JAN + timedelta(hours=2))
    rollups_update()

    summary = carbon_summary(org.pk, datetime(2025, 1, 1, tzinfo=UTC), datetime(2025, 2, 1, tzinfo=UTC))

    year_s = Decimal(365 * 24 * 3600)
    expected = co2e.embodied_share_g(Decimal("876"), Decimal(1) * year_s, 2 * 3600) + co2e.embodied_share_g(
        Decimal("1752"), Decimal("2.5") * year_s, 1 * 3600
    )
    assert summary.embodied_g == expected
    assert summary.embodied_g == Decimal(200) + Decimal(80)  # 876 kg x 2 h / 8760 h + 1752 kg x 1 h / 21900 h


# -- 3. rows that cannot be valued, and a summary that cannot be computed ----------------------------


@pytest.fixture
def lab_org(factors: None) -> Organization:
    """A site in a zone with one hourly factor (10:00) and requests at 10:00 and 12:00, plus one in France."""
    imported = carbon.factor_import_csv(
        data=b"zone,datetime,g_co2e_per_kwh\nZZ-LAB,2025-01-15T10:00:00Z,100\n",
        name="lab.csv",
        allow_new_zones=True,
    )
    assert imported.status == FactorImport.Status.ACCEPTED
    org = OrganizationFactory()
    lab = _device(_site(org, zone="ZZ-LAB", pue="1"))
    _request(org, lab, JAN)
    _request(org, lab, JAN + timedelta(hours=2))
    _request(org, _device(_site(org, pue="1.2")), JAN)
    rollups_update()
    return org


def test_a_row_with_no_factor_for_its_hour_is_listed_not_valued_and_the_rest_are_valued(
    lab_org: Organization,
) -> None:
    broken = HourlyRollup.objects.get(organization=lab_org, hour=JAN + timedelta(hours=2))
    assert "no carbon-intensity factor for zone 'ZZ-LAB'" in broken.carbon_error

    summary = carbon_summary(lab_org.pk, datetime(2025, 1, 1, tzinfo=UTC), datetime(2025, 2, 1, tzinfo=UTC))

    assert [(r["hour"], r["energy_uj"], r["why"]) for r in summary.not_valued] == [
        (broken.hour, KWH_UJ, broken.carbon_error)
    ]
    # 1 kWh x 1 x 100 g/kWh in the lab, 1 kWh x 1.2 x 41.44 g/kWh in France.
    assert summary.location.total.co2e_g == Decimal(100) + Decimal("1.2") * FR_2025
    assert summary.market.total.co2e_g == Decimal(100) + Decimal("1.2") * FR_2025
    assert summary.requests == 3


def test_the_carbon_api_answers_200_with_a_row_not_valued(lab_org: Organization) -> None:
    response = _client(lab_org).get(f"{API}/carbon", {"start": "2025-01-01", "end": "2025-02-01"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert len(body["not_valued"]) == 1
    assert "ZZ-LAB" in body["not_valued"][0]["why"]
    assert Decimal(str(body["location_based"]["total"]["co2e_g"])) > 0


def test_the_carbon_api_answers_409_naming_the_problem_when_the_summary_cannot_be_computed(
    lab_org: Organization, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = _client(lab_org)
    period = {"start": "2025-01-01", "end": "2025-02-01"}
    # The French site moved to a zone without any factor after its rows were valued.
    Site.objects.filter(organization=lab_org, zone="FR").update(zone="ZZ-NONE")
    no_factor = client.get(f"{API}/carbon", period)
    assert no_factor.status_code == 409, no_factor.content
    assert "no carbon-intensity factor for zone 'ZZ-NONE'" in no_factor.json()["error"]

    def tie(*args: Any) -> None:
        raise co2e.AmbiguousFactor("FR", ["11", "12"])

    monkeypatch.setattr(carbon_api, "carbon_summary", tie)
    ambiguous = client.get(f"{API}/carbon", period)
    assert ambiguous.status_code == 409
    assert "ambiguous factors for zone 'FR': 11, 12" in ambiguous.json()["error"]


# -- 4. period and cursor bounds ----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["carbon", "rollups"])
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("start", "2025-01-01T10:30:00Z"),
        ("end", "2025-01-01T10:30:00Z"),
        ("start", "2025-01-01T10:00:01+00:00"),
        ("start", "0001-01-01T00:00:00+05:00"),
        ("start", "0001-01-01"),
        ("end", "9999-12-31T23:00:00Z"),
        ("end", "9999-12-31"),
    ],
)
def test_a_period_off_the_hour_or_outside_the_ledger_s_years_is_a_400_naming_it(
    path: str, name: str, value: str
) -> None:
    response = _client(OrganizationFactory()).get(f"{API}/{path}", {name: value})
    assert response.status_code == 400, response.content
    assert name in response.json()


@pytest.mark.parametrize("path", ["carbon", "rollups"])
def test_whole_days_and_whole_hours_with_an_offset_are_still_fine(path: str) -> None:
    client = _client(OrganizationFactory())
    assert client.get(f"{API}/{path}", {"start": "2025-01-01", "end": "2025-01-02"}).status_code == 200
    hours = {"start": "2025-01-01T10:00:00+05:00", "end": "2025-01-01T12:00:00Z"}
    assert client.get(f"{API}/{path}", hours).status_code == 200


@pytest.mark.parametrize("start", ["0001-01-01T00:00:00", "0001-01-01T00:00:00+05:00", "9999-12-31"])
def test_a_ledger_query_starting_outside_the_ledger_s_years_is_a_400(start: str) -> None:
    response = _client(OrganizationFactory()).get(f"{API}/ledger/requests", {"start": start})
    assert response.status_code == 400, response.content
    assert "start" in response.json()


@pytest.mark.parametrize(
    "raw", [b"[1e30, 1]", b'["a", 1]', f"[{2**70}, 1]".encode(), b"[1, 1.5]", b"[true, 1]"]
)
def test_a_ledger_cursor_that_is_not_two_64_bit_integers_is_a_400(raw: bytes) -> None:
    cursor = base64.urlsafe_b64encode(raw).decode()
    response = _client(OrganizationFactory()).get(f"{API}/ledger/requests", {"cursor": cursor})
    assert response.status_code == 400, response.content
    assert "cursor" in response.json()


# -- 5. rows before the period only use up instruments ---------------------------------------------


def test_a_site_with_rows_only_before_the_period_is_not_in_the_summary(factors: None) -> None:
    org = OrganizationFactory()
    carbon.instrument_create(
        organization=org,
        instrument_id="GO-1",
        kind="GO",
        zone="FR",
        vintage_start=datetime(2025, 1, 1, tzinfo=UTC),
        vintage_end=datetime(2026, 1, 1, tzinfo=UTC),
        mwh="0.001",
        quality_criteria=dict(ALL_CRITERIA),
    )
    january_site = _site(org, pue="1")
    march_site = _site(org, pue="1.1")
    _request(org, _device(january_site), JAN)
    _request(org, _device(march_site), datetime(2025, 3, 10, 9, tzinfo=UTC))
    rollups_update()

    march = carbon_summary(org.pk, datetime(2025, 3, 1, tzinfo=UTC), datetime(2025, 4, 1, tzinfo=UTC))

    assert set(march.sites) == {march_site.pk}
    assert {r["site"] for r in march.pue_records} == {march_site.name}
    # January's row still used up the certificate: March pays the grid average (1.1 kWh x 41.44).
    assert march.market.total.co2e_g == Decimal("1.1") * FR_2025
    assert march.requests == 1


# -- 6. a market-based error does not stick --------------------------------------------------------


def test_a_stored_market_based_error_is_cleared_when_the_market_recompute_succeeds(factors: None) -> None:
    org = OrganizationFactory()
    _request(org, _device(_site(org, pue="1.2")), JAN)
    rollups_update()
    HourlyRollup.objects.filter(organization=org).update(carbon_error="market-based: x", market_co2e_g=None)

    market_recompute(org.pk)

    row = HourlyRollup.objects.get(organization=org)
    assert row.carbon_error == ""
    assert row.market_co2e_g == Decimal("1.2") * FR_2025
    assert row.location_co2e_g == Decimal("1.2") * FR_2025


# -- 7. provider fetches store only new or revised hours -------------------------------------------


class HourlyProvider:
    """A stand-in for a remote API: the history of every hour asked for, from a table of values."""

    name = "hourly-fake"

    def __init__(self) -> None:
        self.values: dict[datetime, Decimal] = {}

    def history(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        hours = int((end - start) / timedelta(hours=1))
        return [self._reading(zone, start + timedelta(hours=i)) for i in range(hours)]

    def forecast(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        return []

    def _reading(self, zone: str, at: datetime) -> ProviderReading:
        return ProviderReading(
            zone=zone,
            period_start=at,
            period_end=at + timedelta(hours=1),
            intensity_g_per_kwh=self.values.get(at, Decimal("42.5")),
            basis="lifecycle",
            signal="carbonIntensity",
            source="Hourly fake",
            licence="test",
            url="https://example.invalid",
            estimated=False,
            forecast=False,
        )


def test_an_hourly_fetch_stores_only_new_hours_and_revised_values(monkeypatch: pytest.MonkeyPatch) -> None:
    provider = HourlyProvider()
    now = datetime(2025, 3, 1, 12, 10, tzinfo=UTC)
    monkeypatch.setattr(timezone, "now", lambda: now)
    first = carbon.intensity_fetch(providers=[provider], zones=["FR"])
    assert [m.row_count for m in first] == [48]
    assert EmissionFactor.objects.filter(factor_import__in=first).count() == 48

    now += timedelta(hours=1)  # 47 hours already stored, identical; one new hour
    second = carbon.intensity_fetch(providers=[provider], zones=["FR"])
    assert [m.row_count for m in second] == [1]
    (new,) = EmissionFactor.objects.filter(factor_import=second[0])
    assert new.period_start == datetime(2025, 3, 1, 12, tzinfo=UTC)

    assert carbon.intensity_fetch(providers=[provider], zones=["FR"]) == []  # nothing new at all

    revised_hour = datetime(2025, 3, 1, 9, tzinfo=UTC)
    provider.values[revised_hour] = Decimal("55.25")  # the provider's estimate replaced by its measurement
    third = carbon.intensity_fetch(providers=[provider], zones=["FR"])
    assert [m.row_count for m in third] == [1]
    (revised,) = EmissionFactor.objects.filter(factor_import=third[0])
    assert (revised.period_start, revised.intensity_g_per_kwh) == (revised_hour, Decimal("55.25"))
    assert factor_set(["FR"], None).hourly[("FR", revised_hour)].intensity_g_per_kwh == Decimal("55.25")
    assert EmissionFactor.objects.filter(factor_import__layout="provider:hourly-fake").count() == 50


# -- 8. decimals that do not fit their column are refused, not a server error ----------------------


@pytest.fixture
def admin(factors: None) -> tuple[Client, Organization, Device]:
    org = OrganizationFactory()
    device = _device(_site(org))
    user_create(organization=org, username=f"admin-{org.slug}", password=PASSWORD, role="admin")
    client = Client(raise_request_exception=False)
    assert client.login(username=f"admin-{org.slug}", password=PASSWORD)
    return client, org, device


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("embodied_kg_co2e", "1e20"),
        ("lifetime_years", "123456.789"),
        ("lifetime_years", "12345.67"),  # two places, but past the column's 4 whole digits
    ],
)
def test_a_device_figure_too_large_for_its_column_is_a_form_error(
    admin: tuple[Client, Organization, Device], field: str, value: str
) -> None:
    client, _, device = admin
    body = {
        "action": "device",
        "device_id": device.device_id,
        "site": str(device.site_id),
        "embodied_kg_co2e": "150",
        "lifetime_years": "4",
        field: value,
    }
    response = client.post("/dashboard/settings", body, follow=True)
    assert response.status_code == 200
    page = response.content.decode()
    assert "device update rejected" in page and field in page
    device.refresh_from_db()
    assert (device.embodied_kg_co2e, device.lifetime_years) == (None, None)


def test_an_instrument_mwh_of_twenty_digits_is_a_form_error(
    admin: tuple[Client, Organization, Device],
) -> None:
    client, org, _ = admin
    response = client.post(
        "/dashboard/settings",
        {
            "action": "instrument",
            "instrument-instrument_id": "GO-HUGE",
            "instrument-kind": "GO",
            "instrument-zone": "FR",
            "instrument-vintage_start": "2025-01-01 00:00",
            "instrument-vintage_end": "2026-01-01 00:00",
            "instrument-mwh": "12345678901234567890",
            "instrument-intensity_g_per_kwh": "0",
            "instrument-criteria": ["conveys_attributes"],
        },
    )
    assert response.status_code == 200
    errors = response.context["instrument_form"].errors
    assert "mwh" in errors
    assert errors["mwh"][0] in response.content.decode()
    assert not ContractualInstrument.objects.filter(organization=org).exists()


def test_the_services_refuse_figures_their_columns_cannot_hold(factors: None) -> None:
    org = OrganizationFactory()
    device = _device(_site(org))
    with pytest.raises(ServiceError, match="embodied_kg_co2e"):
        carbon.device_update(device=device, embodied_kg_co2e="1e20")
    with pytest.raises(ServiceError, match="lifetime_years"):
        carbon.device_update(device=device, lifetime_years="12345.67")
    device.refresh_from_db()
    assert device.embodied_kg_co2e is None
    with pytest.raises(ServiceError, match="decimal places"):
        carbon.site_create(name="rounded", zone="FR", organization=org, pue_relative_uncertainty="0.123456")
    assert not Site.objects.filter(name="rounded").exists()


# -- 9. site names per organization -----------------------------------------------------------------


def test_site_names_are_unique_per_organization_and_the_default_name_is_reserved(factors: None) -> None:
    alpha, bravo = OrganizationFactory(), OrganizationFactory()
    assert carbon.site_create(name="paris", zone="FR", organization=alpha).organization_id == alpha.pk
    assert carbon.site_create(name="paris", zone="FR", organization=bravo).organization_id == bravo.pk
    with pytest.raises(ServiceError, match="you already have a site named 'paris'"):
        carbon.site_create(name="paris", zone="DE", organization=alpha)
    with pytest.raises(ServiceError, match="reserved"):
        carbon.site_create(name=settings.SITE_NAME, zone="FR", organization=alpha)
    assert Site.objects.filter(name="paris").count() == 2
    assert not Site.objects.filter(name=settings.SITE_NAME, organization__isnull=False).exists()


def test_the_default_site_is_one_site_whatever_the_organizations_call_theirs(factors: None) -> None:
    org = OrganizationFactory()
    carbon.site_create(name="paris", zone="FR", organization=org)
    site = default_site()
    assert (site.name, site.organization_id) == (settings.SITE_NAME, None)
    assert default_site().pk == site.pk
    # An organization's site of the same name (made before names were reserved) does not make it ambiguous.
    Site.objects.create(name=settings.SITE_NAME, zone="FR", organization=org)
    assert default_site().pk == site.pk
    assert Site.objects.filter(name=settings.SITE_NAME, organization=None).count() == 1


def test_a_nul_character_in_a_query_parameter_is_a_400_naming_it_on_every_database(client) -> None:
    api = client.get("/api/v1/emission-factors", {"zone": "F\x00R"})
    assert api.status_code == 400
    assert api.json() == {"error": "the query parameter 'zone' contains a NUL character"}
    page = client.get("/dashboard/", {"x\x00": "1"})
    assert page.status_code == 400
    assert b"contains a NUL character" in page.content


def test_recompute_carbon_task_is_retried_when_the_database_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import OperationalError

    import carbon.rollups as rollups

    calls: list[int | None] = []

    def busy_once(organization_id: int | None, **kwargs: object) -> int:
        calls.append(organization_id)
        if len(calls) == 1:
            raise OperationalError("database is locked")
        return 7

    monkeypatch.setattr(rollups, "recompute_carbon", busy_once)
    result = tasks.recompute_carbon.apply(args=(None,))
    assert result.get() == 7
    assert calls == [None, None]
