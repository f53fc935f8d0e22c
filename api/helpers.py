"""What every API view shares: the caller's organization, the scope permissions, instants from the query."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from rest_framework import permissions, serializers
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request

from carbon import co2e
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


# The one range of years of every stored date and every query (carbon.co2e): nanoseconds since 1970 fit the
# ledger's 64-bit columns.
INSTANT_MIN_YEAR, INSTANT_MAX_YEAR = co2e.FIRST_YEAR, co2e.LAST_YEAR


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


class InstantField(serializers.DateTimeField):
    """An ISO 8601 date-time (UTC when it names no zone) within the years every stored date keeps to."""

    def to_internal_value(self, value: Any) -> datetime:
        parsed = super().to_internal_value(value)  # DRF refuses an offset that leaves datetime's range
        problem = co2e.year_problem(parsed.astimezone(UTC), "the date-time")
        if problem:
            raise ValidationError(problem)
        return parsed


class DayField(serializers.DateField):
    """An ISO 8601 date within the years every stored date keeps to."""

    def to_internal_value(self, value: Any) -> date:
        parsed = super().to_internal_value(value)
        problem = co2e.year_problem(parsed, "the date")
        if problem:
            raise ValidationError(problem)
        return parsed


class HasAdminScopeForWrites(permissions.BasePermission):
    message = "this API key or account lacks the 'admin' scope needed to change settings"

    def has_permission(self, request: Request, view: Any) -> bool:
        return request.method in permissions.SAFE_METHODS or "admin" in scopes_of(request.user)


# Read with 'read'; change (POST, PUT, DELETE) with 'admin' too.
READ_ADMIN_WRITES = [permissions.IsAuthenticated, HasReadScope, HasAdminScopeForWrites]
