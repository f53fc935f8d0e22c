"""DRF authentication with the same bearer API keys as the gateway."""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from carbonledger import selectors
from carbonledger.models import ApiKey


class ApiKeyUser:
    """A request authenticated by an API key, standing for its organization."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, api_key: ApiKey) -> None:
        self.api_key = api_key
        self.organization = api_key.organization

    def __str__(self) -> str:
        return f"api-key:{self.api_key.prefix}"


class ApiKeyAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, ApiKey] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise exceptions.AuthenticationFailed("malformed Authorization header: expected 'Bearer <key>'")
        key = selectors.api_key_lookup(token.strip())
        if key is None:
            raise exceptions.AuthenticationFailed("invalid or revoked API key")
        return ApiKeyUser(key), key

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


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


try:  # the OpenAPI schema names the bearer-key scheme (drf-spectacular finds extensions by import)
    from drf_spectacular.extensions import OpenApiAuthenticationExtension

    class ApiKeyScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
        target_class = "carbonledger.api_auth.ApiKeyAuthentication"
        name = "ApiKey"

        def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
            return {"type": "http", "scheme": "bearer", "description": "an API key: cl_<prefix>_<secret>"}

except ImportError:  # pragma: no cover - drf-spectacular is in requirements.txt
    pass
