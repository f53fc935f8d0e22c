from __future__ import annotations

from celery import shared_task
from django.db import OperationalError

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
    from datetime import datetime

    from carbonledger.carbon.rollups import recompute_carbon as recompute

    return recompute(
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
    from carbonledger.carbon.services import intensity_fetch as fetch

    return [record.pk for record in fetch()]


@shared_task(name="carbonledger.verify_ledger")
def verify_ledger(full: bool = False) -> list[str]:
    """Scheduled: link and re-hash the records written since the last verification (and, daily, every
    record from genesis). Read-only on the ledger; each run is recorded, so reruns are harmless."""
    from carbonledger.services import ledger_verify

    return [v.problem or f"{v.chain.chain_id}: intact to seq {v.seq}" for v in ledger_verify(full=full)]
