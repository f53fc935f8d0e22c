"""DRF authentication with the same bearer API keys as the gateway."""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from tenancy import selectors
from tenancy.models import ApiKey


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


try:  # the OpenAPI schema names the bearer-key scheme (drf-spectacular finds extensions by import)
    from drf_spectacular.extensions import OpenApiAuthenticationExtension

    class ApiKeyScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
        target_class = "api.auth.ApiKeyAuthentication"
        name = "ApiKey"

        def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
            return {"type": "http", "scheme": "bearer", "description": "an API key: cl_<prefix>_<secret>"}

except ImportError:  # pragma: no cover - drf-spectacular is in requirements.txt
    pass
