"""The intensity providers the settings name, built with their credentials (INTENSITY_PROVIDERS)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from carbon.providers import IntensityProvider, load_provider


def configured_providers() -> list[IntensityProvider]:
    """The providers named in ``INTENSITY_PROVIDERS``, with their credentials from the environment."""
    providers: list[IntensityProvider] = []
    for name in settings.INTENSITY_PROVIDERS:
        kwargs: dict[str, Any] = {}
        if name == "electricitymaps":
            if not settings.ELECTRICITYMAPS_TOKEN:
                raise ImproperlyConfigured(
                    "INTENSITY_PROVIDERS names electricitymaps but ELECTRICITYMAPS_TOKEN is empty"
                )
            kwargs = {"token": settings.ELECTRICITYMAPS_TOKEN}
        elif name == "watttime":
            if not (settings.WATTTIME_USERNAME and settings.WATTTIME_PASSWORD):
                raise ImproperlyConfigured(
                    "INTENSITY_PROVIDERS names watttime but WATTTIME_USERNAME or WATTTIME_PASSWORD is empty"
                )
            kwargs = {"username": settings.WATTTIME_USERNAME, "password": settings.WATTTIME_PASSWORD}
        try:
            providers.append(load_provider(name, **kwargs))
        except ValueError as exc:
            raise ImproperlyConfigured(f"INTENSITY_PROVIDERS: {exc}") from None
    return providers
