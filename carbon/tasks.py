"""Celery tasks of carbon: each takes ids or plain values and calls one service.

Their names keep the ``carbonledger.`` prefix they were scheduled and queued under before the apps were
split, so beat schedules and messages already in a broker still reach them."""

from __future__ import annotations

from datetime import datetime

from celery import shared_task
from django.db import OperationalError

from carbon import rollups, services


@shared_task(name="carbonledger.rollups_update")
def rollups_update() -> dict[str, object]:
    """Scheduled (Celery beat): fold new ledger records into the hourly rollups. Exactly-once per record,
    so running it twice, or two at a time, is safe."""
    run = rollups.rollups_update()
    return {"records": dict(run.records), "created": run.rows_created, "updated": run.rows_updated}


# Enqueued on a change (factors, PUE, instruments), not on a schedule, so a run lost to a busy database
# would leave the rollups' CO2e stale: on the embedded SQLite, a writer that waited out its 20 s busy
# timeout fails with "database is locked" (seen on a first `make run`, while the demo's recomputes and
# the ledger writer shared the file). It is idempotent, so it is retried.
@shared_task(
    name="carbonledger.recompute_carbon",
    autoretry_for=(OperationalError,),
    retry_backoff=2,
    retry_backoff_max=120,
    retry_jitter=True,
    max_retries=8,
)
def recompute_carbon(
    organization_id: int | None,
    site_id: int | None = None,
    zone: str | None = None,
    start: str | None = None,
    end: str | None = None,
) -> int:
    """Recompute rollup CO2e after factors, PUE or instruments changed (idempotent); ``start``/``end`` are
    ISO 8601 hours that narrow it."""
    return rollups.recompute_carbon(
        organization_id,
        site_id=site_id,
        zone=zone,
        start=datetime.fromisoformat(start) if start else None,
        end=datetime.fromisoformat(end) if end else None,
    )


@shared_task(name="carbonledger.intensity_fetch")
def intensity_fetch() -> list[int]:
    """Scheduled hourly when INTENSITY_PROVIDERS names any: store the providers' recent hourly history as
    new factor versions (an identical answer is not stored twice, so reruns are harmless)."""
    return [record.pk for record in services.intensity_fetch()]
