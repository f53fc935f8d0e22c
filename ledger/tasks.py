"""Celery tasks of the ledger (the name keeps its ``carbonledger.`` prefix: see carbon/tasks.py)."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from ledger.archive import ledger_archive as archive_before
from ledger.archive import period_before
from ledger.partitions import ensure_partitions
from ledger.services import ledger_verify


@shared_task(name="carbonledger.verify_ledger")
def verify_ledger(full: bool = False) -> list[str]:
    """Scheduled: link and re-hash the records written since the last verification (and, daily, every
    record from genesis). Read-only on the ledger; each run is recorded, so reruns are harmless."""
    return [v.problem or f"{v.chain.chain_id}: intact to seq {v.seq}" for v in ledger_verify(full=full)]


@shared_task(name="carbonledger.ledger_archive")
def ledger_archive() -> list[str]:
    """Scheduled daily when LEDGER_RETENTION_MONTHS is set: archive the records older than that many months (what
    was verified and rolled up), then delete them from the database."""
    months = settings.LEDGER_RETENTION_MONTHS
    if not months:
        return []
    return [
        f"{o.chain_id}: seq {o.from_seq + 1}..{o.to_seq} archived"
        if o.to_seq > o.from_seq
        else f"{o.chain_id}: {o.note}"
        for o in archive_before(period_before(months)).outcomes
    ]


@shared_task(name="carbonledger.ledger_partitions")
def ledger_partitions() -> list[str]:
    """Scheduled daily: create the ledger's partitions of this month and LEDGER_PARTITION_MONTHS_AHEAD months
    ahead, and move whatever the default partitions hold into proper ones (PostgreSQL; nothing on SQLite).
    Creates only what is missing, so reruns are harmless."""
    return ensure_partitions(settings.LEDGER_PARTITION_MONTHS_AHEAD)
