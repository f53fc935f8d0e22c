"""Who may do what: the organization a principal (an API key or a dashboard user) acts for, and its scopes.

The API and the dashboard both read these; they are the one place a role becomes scopes."""

from __future__ import annotations

from typing import Any

# What each dashboard role may do, in the API keys' terms; "report" is requesting reports.
ROLE_SCOPES: dict[str, frozenset[str]] = {
    "viewer": frozenset({"read"}),
    "analyst": frozenset({"read", "report"}),
    "admin": frozenset({"read", "report", "admin"}),
}


def organization_of(user: Any) -> Any:
    """The organization an authenticated principal (API key or dashboard user) acts for, or None."""
    org = getattr(user, "organization", None)
    if org is not None:
        return org
    membership = getattr(user, "membership", None) if getattr(user, "is_authenticated", False) else None
    return membership.organization if membership is not None else None


def scopes_of(user: Any) -> frozenset[str]:
    key = getattr(user, "api_key", None)
    if key is not None:
        scopes = key.scope_set
        return scopes | {"report"} if "admin" in scopes else scopes
    membership = getattr(user, "membership", None) if getattr(user, "is_authenticated", False) else None
    return ROLE_SCOPES.get(membership.role, frozenset()) if membership is not None else frozenset()
