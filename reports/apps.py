from django.apps import AppConfig


class ReportsConfig(AppConfig):
    name = "reports"
    verbose_name = "GHG reports"
    default_auto_field = "django.db.models.BigAutoField"
