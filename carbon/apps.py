"""Emission factors, instruments, PUE, rollups and CO2e."""

from django.apps import AppConfig


class CarbonConfig(AppConfig):
    name = "carbon"
    verbose_name = "Carbon"
    default_auto_field = "django.db.models.BigAutoField"
