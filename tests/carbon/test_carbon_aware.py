"""Carbon-aware serving on the Django side: the grid signal of a site (intensity now, threshold and mode), its
settings through the service and the API, the gateway service that hands it to the serving core, and the
dashboard's carbon page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from carbon import selectors as carbon_selectors
from carbon import services as carbon
from carbon.providers import ProviderReading
from carbon.selectors import grid_signal
from carbonledger.gateway_app import GridSignalService
from inference.variants import GridState
from ledger.writer import default_site
from tenancy.services import ServiceError, api_key_create, organization_create, user_create
from tests.support.intensity import forecast_reading

pytestmark = pytest.mark.django_db

PASSWORD = "a-long-test-password-42"


def _hour(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _series(zone: str, now: datetime, values: list[int]) -> bytes:
    """Hourly figures ending with the current hour: values[-1] is this hour's."""
    hour = _hour(now)
    lines = ["zone,datetime,g_co2e_per_kwh"]
    for back, value in enumerate(reversed(values)):
        lines.append(f"{zone},{(hour - timedelta(hours=back)).strftime('%Y-%m-%dT%H:%M:%SZ')},{value}")
    return ("\n".join(lines) + "\n").encode()


def _site(name: str = "paris", zone: str = "FR", org_slug: str = "acme"):  # type: ignore[no-untyped-def]
    carbon.load_shipped_factors()
    org = organization_create(slug=org_slug)
    return carbon.site_create(name=name, zone=zone, organization=org)


def test_the_hour_s_figure_against_the_75th_percentile_of_the_last_30_days() -> None:
    site = _site()
    now = timezone.now()
    # 100 hours: 1..100 g/kWh for the past hours, and 90 now.
    imported = carbon.factor_import_csv(data=_series("FR", now, [*range(1, 100), 90]), name="fr-hourly.csv")
    assert imported.status == "accepted", imported.errors
    signal = grid_signal(site, now)
    assert signal.intensity_g_per_kwh == Decimal(90)
    assert "hourly figure" in signal.intensity_source
    # The past 99 hours are 1..99: the 75th percentile (nearest rank) is 75.
    assert signal.threshold_g_per_kwh == Decimal(75)
    assert "75th percentile of 99 hourly figures" in signal.threshold_source
    assert signal.mode == "efficiency"
    carbon.site_set_carbon_threshold(site=site, percentile=95)
    assert grid_signal(site, now).threshold_g_per_kwh == Decimal(95)
    assert grid_signal(site, now).mode == "normal"
    carbon.site_set_carbon_threshold(site=site, threshold_g_per_kwh="80.5")
    signal = grid_signal(site, now)
    assert (signal.threshold_g_per_kwh, signal.threshold_source, signal.mode) == (
        Decimal("80.5"),
        "the site's threshold",
        "efficiency",
    )


def test_without_an_hourly_series_the_year_s_figure_is_used_and_the_threshold_is_unknown() -> None:
    site = _site()
    signal = grid_signal(site, timezone.now())
    assert signal.intensity_g_per_kwh is not None  # the shipped annual figure of FR
    assert "annual figure" in signal.intensity_source
    assert signal.threshold_g_per_kwh is None and signal.mode == "unknown"
    assert "24 needed" in signal.threshold_source


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threshold_g_per_kwh": "100", "percentile": 50}, "not both"),
        ({"threshold_g_per_kwh": "-1"}, "must be >= 0"),
        ({"threshold_g_per_kwh": "1e20"}, "must be below"),
        ({"percentile": 0}, "from 1 to 99"),
        ({"percentile": 100}, "from 1 to 99"),
    ],
)
def test_bad_thresholds_are_refused_by_name(kwargs: dict[str, object], message: str) -> None:
    site = _site()
    with pytest.raises(ServiceError, match=message):
        carbon.site_set_carbon_threshold(site=site, **kwargs)  # type: ignore[arg-type]


def test_the_api_shows_and_sets_a_site_s_carbon_aware_state_for_its_organization_only() -> None:
    site = _site()
    other = organization_create(slug="other")
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=site.organization, scopes='read,admin').raw_key}"
    )
    url = f"/api/v1/sites/{site.pk}/carbon-aware"
    body = client.get(url).json()
    assert body["mode"] == "unknown" and body["zone"] == "FR"
    changed = client.put(url, {"threshold_g_per_kwh": "10"}, format="json")
    assert changed.status_code == 200
    assert changed.json()["mode"] == "efficiency"  # FR's annual figure is above 10 g/kWh
    assert client.put(url, {"percentile": 100}, format="json").status_code == 400
    both = client.put(url, {"percentile": 50, "threshold_g_per_kwh": "5"}, format="json")
    assert both.status_code == 400 and "not both" in both.json()["error"]
    stranger = APIClient()
    stranger.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=other, scopes='read,admin').raw_key}"
    )
    assert stranger.get(url).status_code == 404
    assert stranger.put(url, {"threshold_g_per_kwh": "1"}, format="json").status_code == 404
    reader = APIClient()
    reader.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=site.organization, scopes='read').raw_key}"
    )
    assert reader.put(url, {"threshold_g_per_kwh": "1"}, format="json").status_code == 403


def test_the_gateway_service_hands_the_default_site_s_signal_to_the_serving_core(settings) -> None:  # type: ignore[no-untyped-def]
    carbon.load_shipped_factors()
    settings.SITE_ZONE = "FR"
    site = default_site()
    now = timezone.now()
    carbon.factor_import_csv(data=_series("FR", now, [*([50] * 48), 400]), name="fr-spike.csv")
    service = GridSignalService(interval_s=3600)
    service.grid = GridState()
    service.refresh()
    assert service.grid.high and service.grid.mode == "efficiency"
    assert service.grid.intensity_g_per_kwh == 400.0 and service.grid.threshold_g_per_kwh == 50.0
    assert "FR" in service.grid.source
    carbon.site_set_carbon_threshold(site=site, threshold_g_per_kwh="500")
    service.refresh()
    assert not service.grid.high and service.grid.mode == "normal"


def test_the_dashboard_carbon_page_shows_each_site_s_mode() -> None:
    site = _site()
    carbon.site_set_carbon_threshold(site=site, threshold_g_per_kwh="1")
    user_create(organization=site.organization, username="lead", password=PASSWORD, role="viewer")
    client = Client()
    assert client.login(username="lead", password=PASSWORD)
    page = client.get("/dashboard/carbon")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Carbon-aware serving now" in html
    assert 'class="mode-efficiency">efficiency' in html
    assert "the site&#x27;s threshold" in html


def test_an_operator_sets_the_gateway_site_s_threshold_with_a_command(settings) -> None:  # type: ignore[no-untyped-def]
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    carbon.load_shipped_factors()
    settings.SITE_ZONE = "FR"
    out = StringIO()
    call_command("carbon_threshold", "--threshold", "5", stdout=out)
    site = default_site()
    assert site.organization_id is None and site.carbon_threshold_g_per_kwh == Decimal(5)
    assert "mode efficiency" in out.getvalue() and "the site's threshold" in out.getvalue()
    call_command("carbon_threshold", "--clear", stdout=StringIO())
    site.refresh_from_db()
    assert site.carbon_threshold_g_per_kwh is None and site.carbon_threshold_percentile is None
    with pytest.raises(CommandError, match="from 1 to 99"):
        call_command("carbon_threshold", "--percentile", "0", stdout=StringIO())
    with pytest.raises(CommandError, match="no site with id 999999"):
        call_command("carbon_threshold", "--site", "999999", stdout=StringIO())


# -- a forecast provider (a remote service, faked at its boundary) ------------------------------------


class HourForecast:
    """Forecasts 400 g/kWh for the hour it is asked from and 101, 102, ... for the hours after it."""

    name = "fake-forecast"
    calls = 0

    def history(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        return []

    def forecast(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        type(self).calls += 1
        out = []
        hour, step = start, 0
        while hour < end:
            out.append(forecast_reading(zone, hour, 400 if step == 0 else 100 + step, "fake forecast feed"))
            hour, step = hour + timedelta(hours=1), step + 1
        return out


class DownForecast(HourForecast):
    def forecast(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        type(self).calls += 1
        raise RuntimeError("provider down")


@pytest.fixture
def forecasts(settings):  # type: ignore[no-untyped-def]
    carbon_selectors._forecast_cache.clear()
    HourForecast.calls = DownForecast.calls = 0
    settings.CARBON_FORECAST_REFRESH_S = 3600
    yield settings
    carbon_selectors._forecast_cache.clear()


def test_a_configured_forecast_gives_the_hour_s_intensity_and_joins_the_percentile(forecasts) -> None:  # type: ignore[no-untyped-def]
    forecasts.INTENSITY_PROVIDERS = [f"{__name__}.HourForecast"]
    site = _site()  # no hourly series: without the forecast the threshold would be unknown
    now = timezone.now()
    signal = grid_signal(site, now)
    assert signal.intensity_g_per_kwh == Decimal(400)
    assert "the forecast of fake-forecast" in signal.intensity_source
    assert "fake forecast feed" in signal.intensity_source
    # 24 forecast hours: 400 and 101..123; the 75th percentile (nearest rank 18) is 118.
    assert signal.threshold_g_per_kwh == Decimal(118)
    assert signal.threshold_source == (
        "the 75th percentile of 0 hourly figures of the last 30 days and 24 forecast hours of fake-forecast"
    )
    assert signal.mode == "efficiency"
    # The series of the last 30 days counts with the forecast: 48 hours at 500 g/kWh raise the threshold.
    carbon.factor_import_csv(data=_series("FR", now, [*([500] * 48), 500]), name="fr-high.csv")
    signal = grid_signal(site, now)
    assert signal.intensity_g_per_kwh == Decimal(400)  # the forecast's figure for the hour comes first
    assert signal.threshold_g_per_kwh == Decimal(500) and signal.mode == "normal"
    assert "48 hourly figures of the last 30 days and 24 forecast hours" in signal.threshold_source


def test_the_forecast_is_fetched_once_per_refresh_period(forecasts) -> None:  # type: ignore[no-untyped-def]
    forecasts.INTENSITY_PROVIDERS = [f"{__name__}.HourForecast"]
    site = _site()
    now = timezone.now()
    for _ in range(3):
        assert grid_signal(site, now).intensity_g_per_kwh == Decimal(400)
    assert HourForecast.calls == 1
    forecasts.CARBON_FORECAST_REFRESH_S = 0.0
    grid_signal(site, now)
    assert HourForecast.calls == 2


def test_a_failing_forecast_provider_falls_back_to_the_series_and_says_why(forecasts) -> None:  # type: ignore[no-untyped-def]
    forecasts.INTENSITY_PROVIDERS = [f"{__name__}.DownForecast"]
    site = _site()
    now = timezone.now()
    carbon.factor_import_csv(data=_series("FR", now, [*range(1, 100), 90]), name="fr-hourly.csv")
    signal = grid_signal(site, now)
    assert signal.intensity_g_per_kwh == Decimal(90)
    assert "hourly figure" in signal.intensity_source
    assert "the forecast of fake-forecast failed (provider down)" in signal.intensity_source
    assert signal.threshold_g_per_kwh == Decimal(75) and signal.mode == "efficiency"
    grid_signal(site, now)
    assert DownForecast.calls == 1  # a provider that is down is not asked again on every read


def test_the_gateway_service_uses_the_configured_forecast(forecasts) -> None:  # type: ignore[no-untyped-def]
    forecasts.INTENSITY_PROVIDERS = [f"{__name__}.HourForecast"]
    carbon.load_shipped_factors()
    forecasts.SITE_ZONE = "FR"
    default_site()
    service = GridSignalService(interval_s=3600)
    service.grid = GridState()
    service.refresh()
    assert service.grid.mode == "efficiency"
    assert (service.grid.intensity_g_per_kwh, service.grid.threshold_g_per_kwh) == (400.0, 118.0)
    assert "forecast of fake-forecast" in service.grid.source
