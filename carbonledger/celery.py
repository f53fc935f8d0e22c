"""Celery app. The embedded default broker is kombu's filesystem transport, so a worker runs with no server."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "carbonledger.settings")

app = Celery("carbonledger")
app.config_from_object("django.conf:settings", namespace="CELERY")


@app.on_configure.connect
def _configure_broker(sender: Celery, **kwargs: object) -> None:
    from django.conf import settings

    if str(settings.CELERY_BROKER_URL).startswith("filesystem://"):
        folder = settings.CELERY_BROKER_DIR
        # The control folder holds the broadcast exchanges (pidbox); kombu's default is ./control, in the
        # working directory, which is the repository on `make run`.
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        sender.conf.broker_transport_options = {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "store_processed": False,
            "control_folder": str(folder / "control"),
        }
    backend = str(settings.CELERY_RESULT_BACKEND)
    if backend.startswith("file://"):
        os.makedirs(backend[len("file://") :], exist_ok=True)


app.autodiscover_tasks()
