"""Readings of a fake intensity provider (a remote service, faked at its boundary)."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from carbon.providers import ProviderReading


def forecast_reading(
    zone: str, hour: datetime, intensity_g_per_kwh: int | str, source: str
) -> ProviderReading:
    """One forecast hour as a provider returns it."""
    return ProviderReading(
        zone=zone,
        period_start=hour,
        period_end=hour + timedelta(hours=1),
        intensity_g_per_kwh=Decimal(intensity_g_per_kwh),
        basis="direct",
        signal="carbonIntensity",
        source=source,
        licence="test",
        url="http://forecast.invalid",
        estimated=True,
        forecast=True,
    )
