"""``/api/v1/``: an index of the management API (every path, its methods and summary, from the same OpenAPI
schema as ``/api/docs/``), so the API's root is no dead end. Like everything under ``/api/v1/`` it answers only
an authenticated caller; anyone else gets a 401 that still says where the documentation is."""

from __future__ import annotations

from functools import cache
from typing import Any

from rest_framework.decorators import api_view, permission_classes, renderer_classes
from rest_framework.permissions import AllowAny
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from api.openapi import doc
from api.schema import SchemaGenerator

DOCS, SCHEMA = "/api/docs/", "/api/schema/"
METHODS = ("get", "post", "put", "patch", "delete")


@cache
def endpoints() -> tuple[dict[str, Any], ...]:
    """Every operation under /api/v1/ with its summary (the schema is fixed while the process runs)."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    found = []
    for path, item in sorted(schema.get("paths", {}).items()):
        if not path.startswith("/api/v1/") or path == "/api/v1/":
            continue
        methods = [m.upper() for m in METHODS if m in item]
        summary = next((item[m].get("summary") for m in METHODS if item.get(m, {}).get("summary")), "")
        found.append({"path": path, "methods": methods, "summary": summary or path})
    return tuple(found)


@doc("This index: every endpoint of the API, with a link to its documentation")
@api_view(["GET"])
@permission_classes([AllowAny])  # the 401 below says where the docs are, which DRF's own refusal cannot
# JSON for clients; a browser (Accept: text/html) gets the same JSON in DRF's browsable page, in the product's look
# (templates/rest_framework/api.html), with the link to the docs page, the API's human face.
@renderer_classes([JSONRenderer, BrowsableAPIRenderer])
def index(request: Request) -> Response:
    if not request.user or not request.user.is_authenticated:
        return Response(
            {
                "detail": "send 'Authorization: Bearer <API key>' or sign in at /accounts/login/",
                "docs": DOCS,
                "schema": SCHEMA,
            },
            status=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
    return Response(
        {
            "name": "CarbonLedger management API",
            "docs": DOCS,
            "schema": SCHEMA,
            "endpoints": list(endpoints()),
        }
    )
