"""The demo: synthetic ledger and set-up commands."""

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
    verbose_name = "Demo"
    default_auto_field = "django.db.models.BigAutoField"
