"""Organizations, memberships, API keys, sites and devices."""

from django.apps import AppConfig


class TenancyConfig(AppConfig):
    name = "tenancy"
    verbose_name = "Tenancy"
    default_auto_field = "django.db.models.BigAutoField"
