"""What every API view shares: the caller's organization, the scope permissions, instants from the query."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rest_framework import permissions
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request

from tenancy.access import organization_of, scopes_of


class HasReadScope(permissions.BasePermission):
    message = "this API key or account lacks the 'read' scope"

    def has_permission(self, request: Request, view: Any) -> bool:
        return "read" in scopes_of(request.user)


def organization_id(request: Request) -> int:
    """The pk of the organization the caller acts for; 403 for an account that belongs to none."""
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


class HasAdminScopeForWrites(permissions.BasePermission):
    message = "this API key or account lacks the 'admin' scope needed to change settings"

    def has_permission(self, request: Request, view: Any) -> bool:
        return request.method in permissions.SAFE_METHODS or "admin" in scopes_of(request.user)


# Read with 'read'; change (POST, PUT, DELETE) with 'admin' too.
READ_ADMIN_WRITES = [permissions.IsAuthenticated, HasReadScope, HasAdminScopeForWrites]
