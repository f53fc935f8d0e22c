"""REST API: the organization, its API keys, models (with live statistics when the gateway runs in this
process) and the ledger (requests, batches, intervals, idle lines) with time, model and site filters,
cursor pagination and a streamed CSV export. Views validate, call a selector or service, serialize."""

from __future__ import annotations

import base64
import csv
import io
import re
import sys
from collections.abc import Iterator
from typing import Any

import orjson
from django.http import StreamingHttpResponse
from rest_framework import serializers, status
from rest_framework.decorators import api_view, parser_classes, permission_classes
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from api.helpers import READ_ADMIN_WRITES, organization_id, query_instant
from api.openapi import LEDGER, doc
from api.parsers import JSONParser
from carbon.model_stats import model_stats
from ledger import selectors as ledger_selectors
from tenancy.access import organization_of, scopes_of
from tenancy.models import ApiKey
from tenancy.services import ServiceError, api_key_create, api_key_revoke

PAGE_MAX = 1000


@doc("Your organization")
@api_view(["GET"])
@permission_classes(READ_ADMIN_WRITES)
def organization(request: Request) -> Response:
    org = organization_of(request.user)
    return Response({"slug": org.slug, "name": org.name, "created_at": org.created_at.isoformat()})


def _key_json(key: ApiKey) -> dict[str, Any]:
    return {
        "prefix": key.prefix,
        "name": key.name,
        "scopes": sorted(key.scope_set),
        "created_at": key.created_at.isoformat(),
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
    }


class ApiKeySerializer(serializers.Serializer[Any]):
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=("infer", "read", "admin")), min_length=1
    )
    name = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")


@doc("List API keys; POST creates one (the key is shown once)", request=ApiKeySerializer)
@api_view(["GET", "POST"])
@permission_classes(READ_ADMIN_WRITES)
@parser_classes([JSONParser])
def api_keys(request: Request) -> Response:
    """List the organization's keys; POST creates one and shows it once (``key``)."""
    org_id = organization_id(request)
    if request.method == "GET":
        return Response({"results": [_key_json(k) for k in ApiKey.objects.filter(organization_id=org_id)]})
    form = ApiKeySerializer(data=request.data)
    form.is_valid(raise_exception=True)
    try:
        created = api_key_create(organization=organization_of(request.user), **form.validated_data)
    except ServiceError as exc:
        raise ValidationError({"error": str(exc)}) from None
    return Response({**_key_json(created.api_key), "key": created.raw_key}, status=status.HTTP_201_CREATED)


@doc("Revoke an API key of your organization")
@api_view(["POST"])
@permission_classes(READ_ADMIN_WRITES)
def api_key_revoke_view(request: Request, prefix: str) -> Response:
    key = ApiKey.objects.filter(organization_id=organization_id(request), prefix=prefix).first()
    if key is None:
        raise NotFound(f"no API key '{prefix}' in your organization")
    return Response(_key_json(api_key_revoke(api_key=key)))


def _running_gateway() -> Any:
    """The gateway served by this process (``manage.py serve``), or None (tests, WSGI)."""
    module = sys.modules.get("carbonledger.asgi")
    router = getattr(module, "application", None) if module is not None else None
    return getattr(router, "_gateway", None)


@doc("Models with live statistics and ledger figures")
@api_view(["GET"])
@permission_classes(READ_ADMIN_WRITES)
def models(request: Request) -> Response:
    """The repository's models with live statistics (when the gateway runs here) and the organization's
    ledger figures for the last hour of traffic."""
    ledger = model_stats(organization_id(request))
    gateway = _running_gateway()
    live: list[dict[str, Any]] = []
    if gateway is not None:
        for row in gateway.repository.index():
            entry = gateway.repository.models.get(row["name"])
            version = entry.versions.get(row.get("version", "")) if entry is not None else None
            live.append({**row, "stats": version.stats.as_triton() if version is not None else None})
    return Response(
        {
            "gateway_running_here": gateway is not None,
            "models": live,
            "ledger_last_hour": [
                {**m, "queue_ms": m["queue_ms"], "compute_ms": m["compute_ms"]} for m in ledger["models"]
            ],
            "batch_sizes": {k: {str(s): n for s, n in v.items()} for k, v in ledger["batch_sizes"].items()},
            "energy_last_30_days": [
                {"model": e["model"], "requests": e["requests"], "j_per_inference": e["j_per_inference"]}
                for e in ledger["energy"]
            ],
        }
    )


# -- the ledger -----------------------------------------------------------------------------------


def _ns(request: Request, name: str) -> int | None:
    value = query_instant(request, name)
    if value is None:
        return None
    return int(value.timestamp()) * 1_000_000_000 + value.microsecond * 1000


def _cursor(raw: str | None) -> tuple[int, int] | None:
    if not raw:
        return None
    try:
        at, pk = orjson.loads(base64.urlsafe_b64decode(raw.encode()))
    except (ValueError, TypeError, orjson.JSONDecodeError):
        at = pk = None
    # Only integers in a 64-bit column's range: anything else would reach the database as an error.
    if not all(type(v) is int and -(2**63) <= v < 2**63 for v in (at, pk)):
        raise ValidationError({"cursor": "not a cursor this API gave out"})
    return at, pk


def _encode(at: int, pk: int) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([at, pk])).decode()


def _filters(request: Request) -> ledger_selectors.LedgerFilter:
    site = request.query_params.get("site")
    # ASCII digits only and within a 64-bit id: str.isdigit() also takes "²" and numbers past the column.
    if site is not None and not re.fullmatch(r"[0-9]{1,18}", site):
        raise ValidationError({"site": "must be a site id"})
    try:
        limit = int(request.query_params.get("limit", "100"))
    except ValueError:
        raise ValidationError({"limit": "must be an integer"}) from None
    if not 1 <= limit <= PAGE_MAX:
        raise ValidationError({"limit": f"must be between 1 and {PAGE_MAX}"})
    start, end = _ns(request, "start"), _ns(request, "end")
    if start is not None and end is not None and start >= end:
        raise ValidationError({"start": "must be before end"})
    return ledger_selectors.LedgerFilter(
        organization_id=organization_id(request),
        start_ns=start,
        end_ns=end,
        model=request.query_params.get("model") or None,
        site_id=int(site) if site else None,
        after=_cursor(request.query_params.get("cursor")),
        limit=limit,
    )


def _page(request: Request, kind: str) -> Response:
    flt = _filters(request)
    rows, next_key = ledger_selectors.ledger_page(kind, flt)
    next_url = None
    if next_key is not None:
        params = request.query_params.copy()
        params["cursor"] = _encode(*next_key)
        next_url = f"{request.path}?{params.urlencode()}"
    return Response({"results": rows, "next": next_url})


@doc("Ledger requests of your organization, keyset-paginated", query=LEDGER)
@api_view(["GET"])
@permission_classes(READ_ADMIN_WRITES)
def ledger_requests(request: Request) -> Response:
    return _page(request, "requests")


@doc("Batches that carried your requests", query=LEDGER)
@api_view(["GET"])
@permission_classes(READ_ADMIN_WRITES)
def ledger_batches(request: Request) -> Response:
    return _page(request, "batches")


@doc("Metering intervals of your devices", query=LEDGER)
@api_view(["GET"])
@permission_classes(READ_ADMIN_WRITES)
def ledger_intervals(request: Request) -> Response:
    return _page(request, "intervals")


@doc("Idle lines of your devices", query=LEDGER)
@api_view(["GET"])
@permission_classes(READ_ADMIN_WRITES)
def ledger_idle(request: Request) -> Response:
    return _page(request, "idle")


@doc("Every matching ledger request as CSV, streamed", query=LEDGER)
@api_view(["GET"])
@permission_classes(READ_ADMIN_WRITES)
def ledger_requests_csv(request: Request) -> StreamingHttpResponse:
    """Every matching request as CSV, streamed (no page limit, constant memory)."""
    flt = _filters(request)

    def lines() -> Iterator[bytes]:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(ledger_selectors.REQUEST_CSV_COLUMNS)
        for row in ledger_selectors.requests_for_export(flt):
            writer.writerow(row)
            if buffer.tell() > 64 * 1024:
                yield buffer.getvalue().encode()
                buffer.seek(0)
                buffer.truncate()
        yield buffer.getvalue().encode()

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="ledger-requests.csv"'
    return response


@doc("The organization and scopes of the caller")
@api_view(["GET"])
def whoami(request: Request) -> Response:
    org = organization_of(request.user)
    return Response(
        {"organization": org.slug if org is not None else None, "scopes": sorted(scopes_of(request.user))}
    )
