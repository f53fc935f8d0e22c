from __future__ import annotations

from celery import shared_task

from tenancy.models import Organization


@shared_task(name="carbonledger.ping")
def ping() -> dict[str, int]:
    """A liveness task: proves the worker runs and reaches the database."""
    return {"organizations": Organization.objects.count()}
