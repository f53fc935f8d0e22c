"""REST API views of the ledger: validate, call a selector or service, serialize."""

from __future__ import annotations

from datetime import UTC, datetime

from rest_framework import permissions
from rest_framework.decorators import api_view, permission_classes
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from api.helpers import HasReadScope, organization_id
from api.openapi import doc
from ledger.selectors import ledger_request_for


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat()


@doc("One ledger request of your organization, with its energy")
@api_view(["GET"])
@permission_classes([permissions.IsAuthenticated, HasReadScope])
def ledger_request_detail(request: Request, request_id: str) -> Response:
    found = ledger_request_for(organization_id(request), request_id)
    if found is None:
        raise NotFound(f"no ledger request '{request_id}' in your organization")
    req = found["request"]
    energy_uj = found["energy_uj"]
    device = found["device"] or {}
    return Response(
        {
            "request_id": req.request_id,
            "client_request_id": req.client_request_id,
            "model": req.model,
            "version": req.version,
            "batch_id": req.batch_id,
            "device_id": req.device_id,
            "received_at": _iso(req.received_ns),
            "started_at": _iso(req.started_ns),
            "finished_at": _iso(req.finished_ns),
            "queue_ms": req.queue_ns / 1e6,
            "compute_ms": req.compute_ns / 1e6,
            "work_units": req.work_units,
            "status": req.status,
            "variant": req.variant,
            "energy_j": None if energy_uj is None else energy_uj / 1e6,
            "energy_final": found["final"],
            "energy_parts": [
                {"interval_id": p["interval_id"], "energy_j": p["energy_uj"] / 1e6, "final": p["final"]}
                for p in found["parts"]
            ],
            "method": device.get("method"),
            "measured": device.get("measured"),
            "relative_uncertainty": device.get("relative_uncertainty"),
            "ledger": {"chain_seq": req.seq, "hash": req.hash},
        }
    )
