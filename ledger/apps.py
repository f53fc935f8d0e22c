"""The append-only, hash-chained ledger."""

from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Ledger"
    default_auto_field = "django.db.models.BigAutoField"
