"""Celery tasks looked up by name, so that an app's services can queue its tasks without importing its
tasks module, which imports those services (a circle). The lowest app holds it so that every app can use it."""

from __future__ import annotations

from typing import Any

from celery import current_app


def task_named(name: str) -> Any:
    """The registered task called ``name`` (its ``@shared_task(name=...)``)."""
    app = current_app
    if name not in app.tasks:
        # Celery's autodiscovery of each installed app's tasks module runs when the default modules load:
        # a worker does it at start, a web process on the first task it sends.
        app.loader.import_default_modules()
    return app.tasks[name]
