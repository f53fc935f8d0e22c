from django.apps import AppConfig


class CarbonLedgerConfig(AppConfig):
    name = "carbonledger"
    verbose_name = "CarbonLedger"
    default_auto_field = "django.db.models.BigAutoField"
