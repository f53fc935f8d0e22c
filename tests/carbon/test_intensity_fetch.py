"""Online providers wired into factor versions: off by default, credentials named, failures kept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ImproperlyConfigured

from carbon import services as carbon
from carbon.models import EmissionFactor, FactorImport
from carbon.providers import ProviderError, ProviderReading

pytestmark = pytest.mark.django_db


class FakeProvider:
    """A stand-in for a remote API (no internet here); the real HTTP clients are tested against a local
    server in test_intensity_providers.py."""

    name = "fake"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[tuple[str, datetime, datetime]] = []

    def history(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        self.calls.append((zone, start, end))
        if self.fail:
            raise ProviderError(self.name, zone, "HTTP 500 from https://example.invalid", status=500)
        return [self._reading(zone, start + timedelta(hours=i), forecast=False) for i in range(3)] + [
            self._reading(zone, end + timedelta(hours=1), forecast=True)
        ]

    def forecast(self, zone: str, start: datetime, end: datetime) -> list[ProviderReading]:
        return []

    def _reading(self, zone: str, at: datetime, forecast: bool) -> ProviderReading:
        return ProviderReading(
            zone=zone,
            period_start=at,
            period_end=at + timedelta(hours=1),
            intensity_g_per_kwh=Decimal("42.5"),
            basis="lifecycle",
            signal="carbonIntensity",
            source="Fake provider",
            licence="test",
            url="https://example.invalid",
            estimated=False,
            forecast=forecast,
        )


def test_no_provider_is_configured_by_default(settings) -> None:
    assert settings.INTENSITY_PROVIDERS == []
    assert carbon.configured_providers() == []


def test_a_provider_without_its_credentials_fails_naming_the_variable(settings) -> None:
    settings.INTENSITY_PROVIDERS = ["electricitymaps"]
    settings.ELECTRICITYMAPS_TOKEN = ""
    with pytest.raises(ImproperlyConfigured, match="ELECTRICITYMAPS_TOKEN"):
        carbon.configured_providers()
    settings.INTENSITY_PROVIDERS = ["watttime"]
    with pytest.raises(ImproperlyConfigured, match="WATTTIME_USERNAME"):
        carbon.configured_providers()
    settings.INTENSITY_PROVIDERS = ["no.such.Provider"]
    with pytest.raises(ImproperlyConfigured, match="INTENSITY_PROVIDERS"):
        carbon.configured_providers()


def test_configured_providers_are_built_from_settings(settings) -> None:
    settings.INTENSITY_PROVIDERS = ["electricitymaps", "watttime"]
    settings.ELECTRICITYMAPS_TOKEN = "t"
    settings.WATTTIME_USERNAME, settings.WATTTIME_PASSWORD = "u", "p"
    assert [p.name for p in carbon.configured_providers()] == ["electricitymaps", "watttime"]


def test_fetched_history_becomes_a_factor_version_without_forecasts_and_only_once() -> None:
    carbon.load_shipped_factors()
    provider = FakeProvider()
    made = carbon.intensity_fetch(providers=[provider], zones=["FR"], hours=3)
    assert len(made) == 1 and made[0].status == "accepted" and made[0].layout == "provider:fake"
    factors = EmissionFactor.objects.filter(factor_import=made[0])
    assert factors.count() == 3  # the forecast hour is not stored
    assert {f.granularity for f in factors} == {"hour"}
    assert carbon.intensity_fetch(providers=[provider], zones=["FR"], hours=3) == []  # identical answer


def test_a_provider_failure_is_kept_as_a_rejected_import_with_its_reason() -> None:
    made = carbon.intensity_fetch(providers=[FakeProvider(fail=True)], zones=["FR"], hours=3)
    assert [m.status for m in made] == ["rejected"]
    assert "HTTP 500" in FactorImport.objects.get(pk=made[0].pk).errors[0]["reason"]


def test_the_fetch_asks_for_whole_past_hours() -> None:
    provider = FakeProvider()
    carbon.intensity_fetch(providers=[provider], zones=["FR"], hours=5)
    zone, start, end = provider.calls[0]
    assert zone == "FR" and end - start == timedelta(hours=5)
    assert end <= datetime.now(UTC) and end.minute == end.second == 0
