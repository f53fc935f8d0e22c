"""REST API views: validate, call a selector or service, serialize."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rest_framework import permissions
from rest_framework.decorators import api_view, permission_classes
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from carbonledger import selectors
from carbonledger.api_auth import organization_of, scopes_of
from carbonledger.openapi import doc


class HasReadScope(permissions.BasePermission):
    message = "this API key or account lacks the 'read' scope"

    def has_permission(self, request: Request, view: Any) -> bool:
        return "read" in scopes_of(request.user)


def _organization_id(request: Request) -> int:
    org = organization_of(request.user)
    if org is None:
        raise PermissionDenied("this account belongs to no organization")
    return int(org.pk)


INSTANT_MIN_YEAR, INSTANT_MAX_YEAR = 1970, 2100  # nanoseconds since 1970 fit the ledger's 64-bit columns


def query_instant(request: Request, name: str) -> datetime | None:
    """The ``name`` query parameter as an aware UTC datetime (naive values are UTC), None when absent;
    a value that is not ISO 8601 or falls outside the years the ledger can hold is a 400 naming it."""
    raw = request.query_params.get(name)
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw)
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except (ValueError, OverflowError):
        raise ValidationError({name: f"not an ISO 8601 date or date-time: {raw!r}"}) from None
    if not INSTANT_MIN_YEAR <= value.year <= INSTANT_MAX_YEAR:
        raise ValidationError(
            {name: f"{raw!r} is outside the years {INSTANT_MIN_YEAR}-{INSTANT_MAX_YEAR} the ledger can hold"}
        )
    return value


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat()


@doc("One ledger request of your organization, with its energy")
@api_view(["GET"])
@permission_classes([permissions.IsAuthenticated, HasReadScope])
def ledger_request_detail(request: Request, request_id: str) -> Response:
    found = selectors.ledger_request_for(_organization_id(request), request_id)
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
