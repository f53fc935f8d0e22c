from __future__ import annotations

from celery import shared_task

from carbonledger import worker_heartbeat  # noqa: F401  (connects the worker's heartbeat to its start and stop)
from tenancy.models import Organization


@shared_task(name="carbonledger.ping")
def ping() -> dict[str, int]:
    """A liveness task: proves the worker runs and reaches the database."""
    return {"organizations": Organization.objects.count()}
