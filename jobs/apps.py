from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Deferred inference jobs"
    default_auto_field = "django.db.models.BigAutoField"
