from __future__ import annotations

from celery import shared_task

from carbonledger.models import Organization


@shared_task(name="carbonledger.ping")
def ping() -> dict[str, int]:
    """A liveness task: proves the worker runs and reaches the database."""
    return {"organizations": Organization.objects.count()}


@shared_task(name="carbonledger.rollups_update")
def rollups_update() -> dict[str, object]:
    """Scheduled (Celery beat): fold new ledger records into the hourly rollups. Exactly-once per record,
    so running it twice, or two at a time, is safe."""
    from carbonledger.carbon.rollups import rollups_update as update

    run = update()
    return {"records": dict(run.records), "created": run.rows_created, "updated": run.rows_updated}


@shared_task(name="carbonledger.recompute_carbon")
def recompute_carbon(organization_id: int | None) -> int:
    """Recompute rollup CO2e after factors, PUE or instruments changed (idempotent)."""
    from carbonledger.carbon.rollups import recompute_carbon as recompute

    return recompute(organization_id)
