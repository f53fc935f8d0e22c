"""OpenAPI descriptions of the function-based API views (drf-spectacular cannot guess their shapes)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema

_TYPES = {
    "str": OpenApiTypes.STR,
    "int": OpenApiTypes.INT,
    "bool": OpenApiTypes.BOOL,
    "date": OpenApiTypes.DATETIME,
}


def doc(
    summary: str,
    *,
    request: Any = None,
    query: Sequence[tuple[str, str, str]] = (),
    methods: Sequence[str] | None = None,
    status: int = 200,
) -> Callable[[Any], Any]:
    """``query``: (name, type in str|int|bool|date, description) of optional query parameters."""
    responses: dict[int, Any] = {
        status: OpenApiTypes.OBJECT,
        400: OpenApiTypes.OBJECT,
        401: OpenApiTypes.OBJECT,
        403: OpenApiTypes.OBJECT,
        404: OpenApiTypes.OBJECT,
    }
    return extend_schema(
        summary=summary,
        request=request,
        responses=responses,
        methods=list(methods) if methods else None,
        parameters=[
            OpenApiParameter(name, _TYPES[kind], OpenApiParameter.QUERY, required=False, description=text)
            for name, kind, text in query
        ],
    )


PERIOD = (
    ("start", "date", "ISO 8601 date or date-time, UTC if no zone (default: 30 days before end)"),
    ("end", "date", "ISO 8601 date or date-time, exclusive (default: the next whole hour)"),
)
LEDGER = (
    ("start", "date", "from this instant (ISO 8601)"),
    ("end", "date", "before this instant (ISO 8601)"),
    ("model", "str", "only this model"),
    ("site", "int", "only devices of this site (id)"),
    ("cursor", "str", "the cursor of the previous page's 'next' link"),
    ("limit", "int", "rows per page, 1..1000 (default 100)"),
)
