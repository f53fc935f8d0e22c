"""The dashboard's pages."""

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Dashboard"
    default_auto_field = "django.db.models.BigAutoField"
