"""Reads of the ledger for the API: one organization's requests, the batches that carried them, and the
metering intervals and idle lines of the devices in its sites. Keyset pagination on (time, id). And the
quarantine, for operators (``ledger_quarantine``) and the gateway's /metrics."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from django.db.models import Q, QuerySet

from ledger.models import (
    ChainOrganization,
    LedgerBatch,
    LedgerBatchEnergy,
    LedgerChain,
    LedgerIdle,
    LedgerInterval,
    LedgerQuarantine,
    LedgerRequest,
    LedgerRequestEnergy,
    period_of,
    period_of_ns,
)
from ledger.ownership import chain_lease_name
from tenancy.leases import LeaseGrant, lease_holder
from tenancy.models import Device


@dataclass(frozen=True)
class LedgerFilter:
    organization_id: int
    start_ns: int | None = None
    end_ns: int | None = None
    model: str | None = None
    site_id: int | None = None
    after: tuple[int, int] | None = None  # (time_ns, id) of the last row of the previous page
    limit: int = 100


@dataclass(frozen=True)
class EnergyPart:
    """A request's share of one metering interval's energy, through its batch."""

    interval_id: str
    energy_uj: int
    final: bool  # the batch is fully allocated with this part
    seq: int  # in its chain: parts come in chain order


_IN_CHUNK = 5_000  # ids per IN (...) list: well inside SQLite's limit on query parameters


def _chunks(ids: list[str]) -> Iterator[list[str]]:
    for i in range(0, len(ids), _IN_CHUNK):
        yield ids[i : i + _IN_CHUNK]


def request_energy_parts(batch_of: Mapping[str, str]) -> dict[str, list[EnergyPart]]:
    """The energy parts of each request in ``batch_of`` (request id -> its batch id), in chain order;
    a request with none yet is absent.

    The ledger holds parts in two forms: one row per request and interval (``LedgerRequestEnergy``, records
    written before batch rows existed) and one row per batch and interval with its split over the batch's
    requests (``LedgerBatchEnergy``). Both are read, so old and new records count alike.
    """
    found: dict[str, list[EnergyPart]] = {}
    for ids in _chunks(list(batch_of)):
        for rid, iid, uj, final, seq in LedgerRequestEnergy.objects.filter(request_id__in=ids).values_list(
            "request_id", "interval_id", "energy_uj", "final", "seq"
        ):
            found.setdefault(rid, []).append(EnergyPart(iid, uj, final, seq))
    for batch_ids in _chunks(sorted(set(batch_of.values()))):
        rows = LedgerBatchEnergy.objects.filter(batch_id__in=batch_ids).values_list(
            "interval_id", "request_ids", "shares_uj", "final", "seq"
        )
        for iid, request_ids, shares_uj, final, seq in rows:
            for rid, uj in zip(orjson.loads(request_ids), orjson.loads(shares_uj), strict=True):
                if rid in batch_of:
                    found.setdefault(rid, []).append(EnergyPart(iid, uj, final, seq))
    for parts in found.values():
        parts.sort(key=lambda p: p.seq)
    return found


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat()


def _org_devices(flt: LedgerFilter) -> list[str]:
    qs = Device.objects.filter(site__organization_id=flt.organization_id)
    if flt.site_id is not None:
        qs = qs.filter(site_id=flt.site_id)
    return list(qs.values_list("device_id", flat=True))


def _window(qs: QuerySet[Any], field: str, flt: LedgerFilter) -> QuerySet[Any]:
    """``qs`` (of records whose own time is ``field``) within the filter's window, in time order. A record is never
    placed in a period before its own time's month, so ``period >= `` the window's first month changes no result
    and lets PostgreSQL skip the older months' partitions (docs/ledger-partitioning.md); no upper bound: a
    straggler may lie in a later period than its month."""
    if flt.start_ns is not None:
        qs = qs.filter(**{f"{field}__gte": flt.start_ns, "period__gte": period_of_ns(flt.start_ns)})
    if flt.end_ns is not None:
        qs = qs.filter(**{f"{field}__lt": flt.end_ns})
    if flt.after is not None:
        at, pk = flt.after
        qs = qs.filter(
            Q(**{f"{field}__gt": at}) | Q(**{field: at, "pk__gt": pk}), period__gte=period_of_ns(at)
        )
    return qs.order_by(field, "pk")


def _requests(flt: LedgerFilter) -> QuerySet[Any]:
    qs = LedgerRequest.objects.filter(organization_id=flt.organization_id)
    if flt.model:
        qs = qs.filter(model=flt.model)
    if flt.site_id is not None:
        qs = qs.filter(device_id__in=_org_devices(flt))
    return _window(qs, "received_ns", flt)


def ledger_page(kind: str, flt: LedgerFilter) -> tuple[list[dict[str, Any]], tuple[int, int] | None]:
    """One page of ``kind`` (requests, batches, intervals, idle) and the key of its last row when more
    may follow."""
    if kind == "requests":
        rows = list(_requests(flt)[: flt.limit])
        parts = request_energy_parts({r.request_id: r.batch_id for r in rows})
        energy = {rid: sum(p.energy_uj for p in ps) for rid, ps in parts.items()}
        out = [
            {
                "request_id": r.request_id,
                "model": r.model,
                "version": r.version,
                "batch_id": r.batch_id,
                "device_id": r.device_id,
                "received_at": _iso(r.received_ns),
                "queue_ms": r.queue_ns / 1e6,
                "compute_ms": r.compute_ns / 1e6,
                "work_units": r.work_units,
                "status": r.status,
                "variant": r.variant,
                "synthetic": r.synthetic,
                "energy_j": None if r.request_id not in energy else energy[r.request_id] / 1e6,
                "chain_seq": r.seq,
                "hash": r.hash,
            }
            for r in rows
        ]
        keys = [(r.received_ns, r.pk) for r in rows]
    elif kind == "batches":
        mine = LedgerRequest.objects.filter(organization_id=flt.organization_id).values("batch_id")
        qs = LedgerBatch.objects.filter(batch_id__in=mine)
        if flt.model:
            qs = qs.filter(model=flt.model)
        if flt.site_id is not None:
            qs = qs.filter(device_id__in=_org_devices(flt))
        rows = list(_window(qs, "start_ns", flt)[: flt.limit])
        out = [
            {
                "batch_id": b.batch_id,
                "model": b.model,
                "version": b.version,
                "device_id": b.device_id,
                "started_at": _iso(b.start_ns),
                "duration_ms": (b.end_ns - b.start_ns) / 1e6,
                "requests": b.requests,
                "status": b.status,
                "variant": b.variant,
            }
            for b in rows
        ]
        keys = [(b.start_ns, b.pk) for b in rows]
    elif kind in ("intervals", "idle"):
        model = LedgerInterval if kind == "intervals" else LedgerIdle
        qs = _window(model.objects.filter(device_id__in=_org_devices(flt)), "t0_ns", flt)
        rows = list(qs[: flt.limit])
        out = []
        for r in rows:
            item = {
                "interval_id": r.interval_id,
                "device_id": r.device_id,
                "start": _iso(r.t0_ns),
                "end": _iso(r.t1_ns),
                "energy_j": r.energy_uj / 1e6,
                "idle_s": r.idle_ns / 1e9,
            }
            if kind == "intervals":
                item.update(
                    method=r.method,
                    counter_start_j=r.counter_start_j,
                    counter_end_j=r.counter_end_j,
                    idle_energy_j=r.idle_uj / 1e6,
                    busy_s=r.busy_ns / 1e9,
                )
            else:
                item["idle_power_w"] = r.idle_power_w
                # The idle balance carried in from earlier intervals (inference/allocation.py): with it, the
                # line's energy can be recomputed from the interval's rows.
                item["owed_in_j"] = r.owed_in_uj / 1e6
            out.append(item)
        keys = [(r.t0_ns, r.pk) for r in rows]
    else:
        raise ValueError(f"unknown ledger kind {kind!r}")
    return out, (keys[-1] if len(rows) == flt.limit and keys else None)


REQUEST_CSV_COLUMNS = (
    "request_id",
    "received_at",
    "model",
    "version",
    "batch_id",
    "device_id",
    "queue_ms",
    "compute_ms",
    "work_units",
    "status",
    "synthetic",
    "energy_j",
    "energy_final",
    "chain_seq",
    "hash",
)


def requests_for_export(flt: LedgerFilter, chunk: int = 2_000) -> Iterator[tuple[Any, ...]]:
    """Every request ``flt`` matches, in order, as CSV values; its energy so far (empty before any of its
    intervals has closed) and whether it is final. Read ``chunk`` requests at a time: constant memory."""
    qs = _requests(LedgerFilter(**{**flt.__dict__, "after": None})).values_list(
        "request_id",
        "received_ns",
        "model",
        "version",
        "batch_id",
        "device_id",
        "queue_ns",
        "compute_ns",
        "work_units",
        "status",
        "synthetic",
        "seq",
        "hash",
    )
    pending: list[tuple[Any, ...]] = []
    for row in qs.iterator(chunk_size=chunk):
        pending.append(row)
        if len(pending) >= chunk:
            yield from _export_rows(pending)
            pending = []
    yield from _export_rows(pending)


def _export_rows(rows: list[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    parts = request_energy_parts({r[0]: r[4] for r in rows})
    for rid, received, model, version, batch, device, queue, compute, units, st, synth, seq, digest in rows:
        mine = parts.get(rid)
        yield (
            rid,
            _iso(received),
            model,
            version,
            batch,
            device,
            queue / 1e6,
            compute / 1e6,
            units,
            st,
            synth,
            sum(p.energy_uj for p in mine) / 1e6 if mine else "",
            any(p.final for p in mine) if mine else False,
            seq,
            digest,
        )


def ledger_request_for(organization_id: int, request_id: str) -> dict[str, object] | None:
    """One ledger request of ``organization_id`` with its energy so far; None when not its own."""
    req = LedgerRequest.objects.filter(request_id=request_id, organization_id=organization_id).first()
    if req is None:
        return None
    found = request_energy_parts({request_id: req.batch_id}).get(request_id, [])
    parts = [{"interval_id": p.interval_id, "energy_uj": p.energy_uj, "final": p.final} for p in found]
    total_uj = sum(p.energy_uj for p in found) if found else None
    final = any(p.final for p in found)
    device = (
        Device.objects.filter(device_id=req.device_id)
        .values("method", "measured", "relative_uncertainty")
        .first()
    )
    return {"request": req, "parts": parts, "energy_uj": total_uj, "final": final, "device": device}


def quarantined_count(chain_id: str | None = None) -> int:
    """Spool lines refused for their data and neither retried nor dismissed yet (one indexed count), of every
    chain or of the chain ``chain_id`` (one replica's: its readiness waits for an operator on them)."""
    rows = LedgerQuarantine.objects.filter(state=LedgerQuarantine.QUARANTINED)
    if chain_id is not None:
        rows = rows.filter(chain__chain_id=chain_id)
    return rows.count()


def quarantine_rows(
    *, include_resolved: bool = False, ids: list[int] | None = None
) -> QuerySet[LedgerQuarantine]:
    """Quarantined lines in chain order (with their chain), the resolved ones too when asked."""
    rows = LedgerQuarantine.objects.select_related("chain").order_by("chain_id", "marker_seq")
    if not include_resolved:
        rows = rows.filter(state=LedgerQuarantine.QUARANTINED)
    if ids is not None:
        rows = rows.filter(pk__in=ids)
    return rows


def chain_lease(chain_id: str) -> LeaseGrant | None:
    """Who holds the database lease of a ledger chain (live or lapsed: compare ``expires_at`` with the
    database's clock), or None when no process ever claimed it. See ledger/ownership.py."""
    return lease_holder(chain_lease_name(chain_id))


def organization_chains(organization_id: int, start: datetime, end: datetime) -> QuerySet[LedgerChain]:
    """The chains holding the organization's records of [``start``, ``end``) as far as the rollups have read
    them, by chain id: those whose months of the organization's records overlap the period's, and those whose
    months are unknown (rolled up before they were kept). Another organization's chains are not listed."""
    first, last = period_of(start), period_of(end - timedelta(microseconds=1))
    own = ChainOrganization.objects.filter(organization_id=organization_id).filter(
        Q(first_period__isnull=True) | Q(first_period__lte=last, last_period__gte=first)
    )
    return LedgerChain.objects.filter(pk__in=own.values("chain_id")).order_by("chain_id")
