"""Writes of the ledger: adjusting entries, verification runs, and the quarantine's retries and dismissals."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from ledger.models import (
    LedgerAdjustment,
    LedgerChain,
    LedgerIdle,
    LedgerInterval,
    LedgerQuarantine,
    LedgerQuarantineMarker,
    LedgerRequest,
    LedgerVerification,
)
from ledger.records import GENESIS, KINDS, link_hash, normalize
from ledger.selectors import quarantine_rows
from ledger.verify import checkpoints, verify_chains
from ledger.writer import (
    QUARANTINE_ERROR_CHARS,
    append_marker,
    chain_and_insert,
    describe_error,
    refused_by_database,
    safe_text,
    screen_line,
    upsert_devices,
    without_existing,
)
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


def ledger_verify(*, full: bool = False, workers: int | None = None) -> list[Any]:
    """Verify every chain and record the result (a ``LedgerVerification`` per chain).

    Incremental by default: from the newest intact verification of each chain (the records up to it were
    linked then; a later full run re-checks them). ``full`` starts every chain from genesis, or from its archive
    checkpoint (``ledger/archive.py``). The chains, and
    segments of a long chain, are checked in ``workers`` processes (default ``LEDGER_VERIFY_WORKERS``).
    """
    start = timezone.now()
    archived = checkpoints()
    starts = []
    for chain in LedgerChain.objects.order_by("pk"):
        # A full run starts at genesis, or at the chain's archive checkpoint: the records before it are in
        # archive files (verify_ledger --archive), and its first record kept must link to the archive's last hash.
        after_seq, after_hash = archived.get(chain.pk, (0, GENESIS))
        last = (
            None
            if full
            else LedgerVerification.objects.filter(chain=chain, problem="", seq__gte=after_seq)
            .order_by("-seq")
            .first()
        )
        if last is not None:
            after_seq, after_hash = last.seq, last.hash
        starts.append((chain, after_seq, after_hash))
    reports = verify_chains(starts, workers=workers)
    finished = timezone.now()
    return [
        LedgerVerification.objects.create(
            chain=chain,
            from_seq=report.from_seq,  # its start, or the checkpoint of an archive made while it ran
            seq=chain.head_seq if report.broken is None else report.broken.seq - 1,
            hash=chain.head_hash if report.broken is None else "",
            records=report.records,
            problem="" if report.broken is None else str(report.broken),
            started_at=start,
            finished_at=finished,
        )
        for (chain, _, _), report in zip(starts, reports, strict=True)
    ]


@dataclass(frozen=True)
class QuarantineOutcome:
    """What a retry or dismissal did to one quarantined line."""

    quarantine_id: int
    state: str  # the line's state afterwards (quarantined: the retry failed again)
    seq: int | None  # the seq of the retried or dismissed marker it wrote, None when it wrote none
    detail: str


def quarantine_retry(ids: list[int] | None = None) -> list[QuarantineOutcome]:
    """Write quarantined lines (all, or those of ``ids``) into their chains, after whatever refused them was
    fixed (a column widened, a value the normaliser now takes). Each goes in as a ``retried`` marker naming its
    quarantine marker, followed by the record itself; the line is then resolved. A line that is refused again
    stays quarantined (its attempts counted, the error kept); one whose record the ledger already holds is
    dismissed as such. Lines already resolved are left alone, so running it twice changes nothing."""
    return [_retry_one(pk) for pk in list(quarantine_rows(ids=ids).values_list("pk", flat=True))]


def quarantine_dismiss(ids: list[int], *, reason: str, actor: str) -> list[QuarantineOutcome]:
    """Give up quarantined lines that can never be written (a NUL in a request id): a ``dismissed`` marker in
    their chain says who and why, and the lines (kept) no longer count as quarantined."""
    if not ids:
        raise ServiceError("name the quarantined lines to dismiss (their ids in `ledger_quarantine`)")
    if not reason.strip():
        raise ServiceError("a dismissal needs a reason")
    if not actor.strip():
        raise ServiceError("a dismissal needs an actor (who made it)")
    return [_dismiss_one(pk, f"dismissed by {actor.strip()}: {reason.strip()}") for pk in ids]


def _locked(pk: int) -> tuple[LedgerChain, LedgerQuarantine] | None:
    """The quarantined line and its chain, both locked (the chain first, as the writer locks it), or None when
    the line is no longer quarantined (resolved by another run meanwhile) or does not exist."""
    chain_pk = LedgerQuarantine.objects.filter(pk=pk).values_list("chain_id", flat=True).first()
    if chain_pk is None:
        return None
    chain = LedgerChain.objects.select_for_update().get(pk=chain_pk)
    row = (
        LedgerQuarantine.objects.select_for_update().filter(pk=pk, state=LedgerQuarantine.QUARANTINED).first()
    )
    return None if row is None else (chain, row)


def _resolve(
    chain: LedgerChain, row: LedgerQuarantine, state: str, seq: int, note: str = ""
) -> QuarantineOutcome:
    chain.save(update_fields=["head_seq", "head_hash"])
    row.state, row.resolved_at, row.resolved_seq, row.note = state, timezone.now(), seq, note
    row.save(update_fields=["state", "resolved_at", "resolved_seq", "note"])
    return QuarantineOutcome(row.pk, state, seq, note)


def _marker(chain: LedgerChain, row: LedgerQuarantine, action: str, detail: str = "") -> int:
    return append_marker(
        chain,
        action=action,
        line_sha256=row.line_sha256,
        spool_position=row.spool_position,
        record_kind=row.record_kind,
        record_id=row.record_id,
        detail=detail,
        marker_seq=row.marker_seq,
        created_ns=time.time_ns(),
    )


@transaction.atomic
def _retry_one(pk: int) -> QuarantineOutcome:
    locked = _locked(pk)
    if locked is None:
        return QuarantineOutcome(pk, "", None, "not quarantined (any more)")
    chain, row = locked
    record, problem = screen_line(bytes(row.line))
    if not problem and record is not None:
        if record.get("k") != "device" and not without_existing([record]):
            held = "the ledger already holds this record"
            return _resolve(
                chain,
                row,
                LedgerQuarantine.DISMISSED,
                _marker(chain, row, LedgerQuarantineMarker.DISMISSED, held),
                held,
            )
        head = (chain.head_seq, chain.head_hash)
        try:
            with transaction.atomic():
                seq = _marker(chain, row, LedgerQuarantineMarker.RETRIED)
                if record.get("k") == "device":
                    upsert_devices([record])
                else:
                    chain_and_insert(chain, [record])
            return _resolve(chain, row, LedgerQuarantine.RETRIED, seq)
        except Exception as exc:
            if not (refused_by_database(exc) or isinstance(exc, KeyError)):  # KeyError: a device's missing id
                raise
            chain.head_seq, chain.head_hash = head  # the savepoint took the marker back
            problem = describe_error(exc)
    row.attempts += 1
    row.last_error = safe_text(problem, QUARANTINE_ERROR_CHARS)
    row.save(update_fields=["attempts", "last_error"])
    return QuarantineOutcome(row.pk, row.state, None, row.last_error)


@transaction.atomic
def _dismiss_one(pk: int, detail: str) -> QuarantineOutcome:
    locked = _locked(pk)
    if locked is None:
        return QuarantineOutcome(pk, "", None, "not quarantined (any more)")
    chain, row = locked
    seq = _marker(chain, row, LedgerQuarantineMarker.DISMISSED, detail)
    return _resolve(chain, row, LedgerQuarantine.DISMISSED, seq, safe_text(detail, QUARANTINE_ERROR_CHARS))
