"""Writes of the ledger: adjusting entries and verification runs."""

from __future__ import annotations

import time
from typing import Any

from django.db import transaction
from django.utils import timezone

from ledger.models import (
    LedgerAdjustment,
    LedgerChain,
    LedgerIdle,
    LedgerInterval,
    LedgerRequest,
    LedgerVerification,
)
from ledger.records import GENESIS, KINDS, link_hash, normalize
from ledger.verify import verify_chain
from tenancy.services import ServiceError

ADJUSTMENT_CHAIN = "adjustments"


@transaction.atomic
def ledger_adjust(
    *, target_kind: str, target_id: str, energy_delta_uj: int, reason: str, actor: str
) -> LedgerAdjustment:
    """Correct the ledger without touching a record: append an adjusting entry (hash-chained)."""
    if target_kind not in ("request", "interval", "idle"):
        raise ServiceError(f"target_kind must be request, interval or idle, got {target_kind!r}")
    if not reason.strip():
        raise ServiceError("an adjustment needs a reason")
    if not actor.strip():
        raise ServiceError("an adjustment needs an actor (who made it)")
    model = {"request": LedgerRequest, "interval": LedgerInterval, "idle": LedgerIdle}[target_kind]
    key = "request_id" if target_kind == "request" else "interval_id"
    if not model.objects.filter(**{key: target_id}).exists():
        raise ServiceError(f"no {target_kind} '{target_id}' in the ledger")
    LedgerChain.objects.get_or_create(chain_id=ADJUSTMENT_CHAIN)
    chain = LedgerChain.objects.select_for_update().get(chain_id=ADJUSTMENT_CHAIN)
    kind = KINDS["adjustment"]
    record = {
        "target_kind": target_kind,
        "target_id": target_id,
        "energy_delta_uj": int(energy_delta_uj),
        "reason": reason.strip(),
        "actor": actor.strip(),
        "created_ns": time.time_ns(),
    }
    values = normalize(kind, record)
    seq = chain.head_seq + 1
    digest = link_hash(chain.head_hash, "adjustment", seq, values)
    adj = LedgerAdjustment.objects.create(
        chain=chain, seq=seq, prev_hash=chain.head_hash, hash=digest, **record
    )
    chain.head_seq = seq
    chain.head_hash = digest
    chain.save(update_fields=["head_seq", "head_hash"])
    return adj


def ledger_verify(*, full: bool = False) -> list[Any]:
    """Verify every chain and record the result (a ``LedgerVerification`` per chain).

    Incremental by default: from the newest intact verification of each chain (the records up to it were
    linked then; a later full run re-checks them). ``full`` starts every chain from genesis.
    """
    results = []
    for chain in LedgerChain.objects.order_by("pk"):
        start = timezone.now()
        last = (
            None
            if full
            else LedgerVerification.objects.filter(chain=chain, problem="").order_by("-seq").first()
        )
        after_seq, after_hash = (last.seq, last.hash) if last is not None else (0, GENESIS)
        report = verify_chain(chain, after_seq, after_hash)
        results.append(
            LedgerVerification.objects.create(
                chain=chain,
                from_seq=after_seq,
                seq=chain.head_seq if report.broken is None else report.broken.seq - 1,
                hash=chain.head_hash if report.broken is None else "",
                records=report.records,
                problem="" if report.broken is None else str(report.broken),
                started_at=start,
                finished_at=timezone.now(),
            )
        )
    return results
