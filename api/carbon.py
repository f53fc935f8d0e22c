"""REST API of the carbon domain: factor imports (upload a CSV, see its result), factors, residual mixes,
instruments, sites and PUE records, devices, rollups and the carbon summary. Views validate, call a
service or selector, and serialize; every object belongs to the caller's organization (or is shared)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Q
from rest_framework import serializers, status
from rest_framework.decorators import api_view, parser_classes, permission_classes
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from api.helpers import (
    INSTANT_MAX_YEAR,
    READ_ADMIN_WRITES,
    InstantField,
    organization_id,
    query_instant,
)
from api.openapi import PERIOD, doc
from api.parsers import JSONParser
from carbon import co2e, services
from carbon.models import ContractualInstrument, EmissionFactor, FactorImport, ResidualMix
from carbon.selectors import (
    ROLLUP_STEPS,
    carbon_summary,
    factor_attributions,
    grid_signal,
    instrument_summary,
    rollup_series,
)
from inference import limits
from tenancy.access import organization_of
from tenancy.models import Device, Site
from tenancy.services import ServiceError

MAX_UPLOAD_BYTES = 50 * 1024 * 1024


def _actor(request: Request) -> str:
    return str(request.user)


def _bad(exc: ServiceError) -> ValidationError:
    return ValidationError({"error": str(exc)})


def _period(request: Request, default_days: int = 30) -> tuple[datetime, datetime]:
    def parse(name: str) -> datetime | None:
        value = query_instant(request, name)
        if value is None:
            return None
        # The rollups are hourly: a period cut inside an hour would silently count the whole hour or none.
        if (value.minute, value.second, value.microsecond) != (0, 0, 0):
            raw = request.query_params.get(name)
            raise ValidationError({name: f"{raw!r} is not on a whole UTC hour (the rollups are hourly)"})
        return value

    end = parse("end") or datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    start = parse("start") or end - timedelta(days=default_days)
    if start >= end:
        raise ValidationError(
            {"start": f"start ({start.isoformat()}) must be before end ({end.isoformat()})"}
        )
    return start, end


# -- factor imports and factors -------------------------------------------------------------------


def _import_json(record: FactorImport) -> dict[str, Any]:
    errors, error_count = services.import_errors(record)
    return {
        "id": record.pk,
        "name": record.name,
        "layout": record.layout,
        "status": record.status,
        "shared": record.organization_id is None,
        "row_count": record.row_count,
        "errors": errors,  # the first problems only; error_count says how many there were
        "error_count": error_count,
        "checksum_sha256": record.checksum_sha256,
        "created_by": record.created_by,
        "created_at": record.created_at.isoformat(),
    }


class FactorUploadSerializer(serializers.Serializer[Any]):
    file = serializers.FileField()
    source = serializers.CharField(required=False, allow_blank=True, max_length=500)
    licence = serializers.CharField(required=False, allow_blank=True, max_length=200)
    url = serializers.URLField(required=False, allow_blank=True)
    allow_new_zones = serializers.BooleanField(required=False, default=False)


@doc("Factor imports (versions); POST uploads a CSV (all or nothing)", request=FactorUploadSerializer)
@api_view(["GET", "POST"])
@permission_classes(READ_ADMIN_WRITES)
@parser_classes([MultiPartParser, FormParser])
def factor_imports(request: Request) -> Response:
    org_id = organization_id(request)
    if request.method == "GET":
        records = FactorImport.objects.filter(Q(organization_id=org_id) | Q(organization__isnull=True))
        return Response({"results": [_import_json(r) for r in records[:200]]})
    form = FactorUploadSerializer(data=request.data)
    form.is_valid(raise_exception=True)
    upload = form.validated_data["file"]
    if upload.size > MAX_UPLOAD_BYTES:
        raise ValidationError({"file": f"the file is {upload.size} bytes; the limit is {MAX_UPLOAD_BYTES}"})
    try:
        record = services.factor_import_csv(
            data=upload.read(),
            name=upload.name or "upload.csv",
            organization=organization_of(request.user),
            created_by=_actor(request),
            source=form.validated_data.get("source") or None,
            licence=form.validated_data.get("licence") or None,
            url=form.validated_data.get("url") or None,
            allow_new_zones=form.validated_data["allow_new_zones"],
        )
    except ServiceError as exc:
        return Response({"error": str(exc)}, status=status.HTTP_409_CONFLICT)
    if record.status != FactorImport.Status.ACCEPTED:
        body = _import_json(record)
        shown = len(body["errors"])
        listed = f" (the first {shown} are listed)" if shown < body["error_count"] else ""
        return Response(
            {
                "error": f"{body['error_count']} row(s) rejected; nothing was imported{listed}",
                "import": body,
            },
            status=status.HTTP_422_UNPROCESSABLE_ENTITY,
        )
    return Response(_import_json(record), status=status.HTTP_201_CREATED)


@doc("One factor import with its result")
@api_view(["GET"])
@permission_classes(READ_ADMIN_WRITES)
def factor_import_detail(request: Request, pk: int) -> Response:
    org_id = organization_id(request)
    record = FactorImport.objects.filter(
        Q(organization_id=org_id) | Q(organization__isnull=True), pk=pk
    ).first()
    if record is None:
        raise NotFound(f"no factor import {pk} visible to your organization")
    return Response(_import_json(record))


@doc(
    "Emission factors visible to you, with their attribution",
    query=(("zone", "str", "grid zone"), ("limit", "int", "at most this many, 0..5000")),
)
@api_view(["GET"])
@permission_classes(READ_ADMIN_WRITES)
def emission_factors(request: Request) -> Response:
    org_id = organization_id(request)
    qs = EmissionFactor.objects.filter(
        Q(factor_import__organization_id=org_id) | Q(factor_import__organization__isnull=True),
        factor_import__status=FactorImport.Status.ACCEPTED,
    ).order_by("zone", "granularity", "period_start", "id")
    zone = request.query_params.get("zone")
    if zone:
        qs = qs.filter(zone=zone)
    try:
        limit = min(int(request.query_params.get("limit", "500")), 5000)
    except ValueError:
        raise ValidationError({"limit": "must be an integer"}) from None
    if limit < 0:
        raise ValidationError({"limit": f"must be >= 0, got {limit}"})
    fields = ("id", "factor_import_id", "zone", "zone_name", "granularity", "period_start", "period_end")
    rows = qs.values(
        *fields,
        "intensity_g_per_kwh",
        "basis",
        "gases",
        "source",
        "licence",
        "url",
        "published",
        "estimated",
        "relative_uncertainty",
    )[:limit]
    return Response({"results": list(rows), "attribution": factor_attributions(organization_id=org_id)})


# -- residual mixes and instruments ----------------------------------------------------------------


class ResidualMixSerializer(serializers.Serializer[Any]):
    zone = serializers.CharField(max_length=32)
    year = serializers.IntegerField(min_value=services.RESIDUAL_MIX_FIRST_YEAR, max_value=INSTANT_MAX_YEAR)
    intensity_g_per_kwh = serializers.DecimalField(max_digits=12, decimal_places=6, min_value=Decimal(0))
    source = serializers.CharField(max_length=1000)
    licence = serializers.CharField(required=False, allow_blank=True, default="")
    url = serializers.URLField(required=False, allow_blank=True, default="")
    relative_uncertainty = serializers.DecimalField(
        max_digits=6, decimal_places=4, min_value=Decimal(0), required=False, default=Decimal(0)
    )


@doc("Residual-mix factors; POST records one", request=ResidualMixSerializer)
@api_view(["GET", "POST"])
@permission_classes(READ_ADMIN_WRITES)
@parser_classes([JSONParser])
def residual_mixes(request: Request) -> Response:
    org_id = organization_id(request)
    if request.method == "GET":
        rows = ResidualMix.objects.filter(Q(organization_id=org_id) | Q(organization__isnull=True)).values(
            "id", "zone", "year", "intensity_g_per_kwh", "source", "licence", "url", "relative_uncertainty"
        )
        return Response({"results": list(rows)})
    form = ResidualMixSerializer(data=request.data)
    form.is_valid(raise_exception=True)
    try:
        mix = services.residual_mix_create(organization=organization_of(request.user), **form.validated_data)
    except ServiceError as exc:
        raise _bad(exc) from None
    return Response({"id": mix.pk, **form.data}, status=status.HTTP_201_CREATED)


class InstrumentSerializer(serializers.Serializer[Any]):
    instrument_id = serializers.CharField(max_length=100)
    kind = serializers.ChoiceField(choices=ContractualInstrument.KINDS)
    zone = serializers.CharField(max_length=32)
    vintage_start = InstantField()
    vintage_end = InstantField()
    mwh = serializers.DecimalField(
        max_digits=16, decimal_places=6, allow_null=True, required=False, default=None
    )
    intensity_g_per_kwh = serializers.DecimalField(
        max_digits=12, decimal_places=6, min_value=Decimal(0), required=False, default=Decimal(0)
    )
    certificate_ids = serializers.CharField(required=False, allow_blank=True, default="")
    retirement_evidence = serializers.CharField(required=False, allow_blank=True, default="")
    quality_criteria = serializers.DictField(child=serializers.BooleanField(), required=False, default=dict)
    notes = serializers.CharField(required=False, allow_blank=True, default="")


@doc("Contractual instruments; POST records one", request=InstrumentSerializer)
@api_view(["GET", "POST"])
@permission_classes(READ_ADMIN_WRITES)
@parser_classes([JSONParser])
def instruments(request: Request) -> Response:
    org_id = organization_id(request)
    if request.method == "GET":
        records = ContractualInstrument.objects.filter(organization_id=org_id)
        return Response({"results": [instrument_summary(r) for r in records]})
    form = InstrumentSerializer(data=request.data)
    form.is_valid(raise_exception=True)
    try:
        record = services.instrument_create(
            organization=organization_of(request.user), created_by=_actor(request), **form.validated_data
        )
    except ServiceError as exc:
        raise _bad(exc) from None
    return Response(instrument_summary(record), status=status.HTTP_201_CREATED)


# -- sites and devices -----------------------------------------------------------------------------


class SiteSerializer(serializers.Serializer[Any]):
    name = serializers.SlugField(max_length=64)
    zone = serializers.CharField(max_length=32)
    pue = serializers.DecimalField(max_digits=5, decimal_places=3, min_value=Decimal(1), max_value=Decimal(5))
    pue_source = serializers.ChoiceField(choices=("declared", "measured"), default="declared")
    pue_relative_uncertainty = serializers.DecimalField(
        max_digits=6, decimal_places=4, min_value=Decimal(0), required=False, default=Decimal(0)
    )
    electricity = serializers.ChoiceField(choices=Site.Electricity.values, default=Site.Electricity.OWNED)


class PueSerializer(serializers.Serializer[Any]):
    pue = serializers.DecimalField(max_digits=5, decimal_places=3, min_value=Decimal(1), max_value=Decimal(5))
    source = serializers.ChoiceField(choices=("declared", "measured"))
    valid_from = InstantField()
    relative_uncertainty = serializers.DecimalField(
        max_digits=6, decimal_places=4, min_value=Decimal(0), required=False, default=Decimal(0)
    )
    note = serializers.CharField(required=False, allow_blank=True, default="")


def _site_json(site: Site) -> dict[str, Any]:
    return {
        "id": site.pk,
        "name": site.name,
        "zone": site.zone,
        "pue": site.pue,
        "pue_source": site.pue_source,
        "electricity": site.electricity,
        "scope_category": site.scope_category,
        "iso_category": co2e.ISO_14064_CATEGORY[site.scope_category],  # type: ignore[index]
        "pue_records": [
            {
                "id": r.pk,
                "valid_from": r.valid_from.isoformat(),
                "pue": r.pue,
                "source": r.source,
                "relative_uncertainty": r.relative_uncertainty,
                "note": r.note,
            }
            for r in site.pue_records.all()
        ],
    }


@doc("Sites; POST creates one with its first PUE record", request=SiteSerializer)
@api_view(["GET", "POST"])
@permission_classes(READ_ADMIN_WRITES)
@parser_classes([JSONParser])
def sites(request: Request) -> Response:
    org_id = organization_id(request)
    if request.method == "GET":
        return Response({"results": [_site_json(s) for s in Site.objects.filter(organization_id=org_id)]})
    form = SiteSerializer(data=request.data)
    form.is_valid(raise_exception=True)
    try:
        site = services.site_create(organization=organization_of(request.user), **form.validated_data)
    except ServiceError as exc:
        raise _bad(exc) from None
    return Response(_site_json(site), status=status.HTTP_201_CREATED)


@doc("Append a PUE record to a site", request=PueSerializer)
@api_view(["POST"])
@permission_classes(READ_ADMIN_WRITES)
@parser_classes([JSONParser])
def site_pue(request: Request, pk: int) -> Response:
    site = Site.objects.filter(organization_id=organization_id(request), pk=pk).first()
    if site is None:
        raise NotFound(f"no site {pk} in your organization")
    form = PueSerializer(data=request.data)
    form.is_valid(raise_exception=True)
    try:
        services.site_set_pue(site=site, **form.validated_data)
    except ServiceError as exc:
        raise _bad(exc) from None
    return Response(_site_json(site), status=status.HTTP_201_CREATED)


class CarbonAwareSerializer(serializers.Serializer[Any]):
    threshold_g_per_kwh = serializers.DecimalField(
        max_digits=12, decimal_places=6, min_value=Decimal(0), required=False, allow_null=True, default=None
    )
    percentile = serializers.IntegerField(
        min_value=1, max_value=99, required=False, allow_null=True, default=None
    )


def _signal_json(site: Site) -> dict[str, Any]:
    from django.utils import timezone

    signal = grid_signal(site, timezone.now())
    return {
        "site": site.pk,
        "zone": signal.zone,
        "mode": signal.mode,
        "intensity_g_per_kwh": signal.intensity_g_per_kwh,
        "intensity_source": signal.intensity_source,
        "threshold_g_per_kwh": signal.threshold_g_per_kwh,
        "threshold_source": signal.threshold_source,
        "site_threshold_g_per_kwh": site.carbon_threshold_g_per_kwh,
        "site_percentile": site.carbon_threshold_percentile,
    }


@doc(
    "Carbon-aware serving at a site: the grid now, the threshold and the mode; PUT sets the threshold",
    request=CarbonAwareSerializer,
)
@api_view(["GET", "PUT"])
@permission_classes(READ_ADMIN_WRITES)
@parser_classes([JSONParser])
def site_carbon_aware(request: Request, pk: int) -> Response:
    site = Site.objects.filter(organization_id=organization_id(request), pk=pk).first()
    if site is None:
        raise NotFound(f"no site {pk} in your organization")
    if request.method == "PUT":
        form = CarbonAwareSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            services.site_set_carbon_threshold(
                site=site,
                threshold_g_per_kwh=form.validated_data["threshold_g_per_kwh"],
                percentile=form.validated_data["percentile"],
            )
        except ServiceError as exc:
            raise _bad(exc) from None
    return Response(_signal_json(site))


class DeviceSerializer(serializers.Serializer[Any]):
    site = serializers.IntegerField(required=False)
    embodied_kg_co2e = serializers.DecimalField(
        max_digits=12, decimal_places=3, min_value=Decimal(0), required=False
    )
    lifetime_years = serializers.DecimalField(
        max_digits=6, decimal_places=2, min_value=Decimal("0.01"), required=False
    )


def _device_json(device: Device) -> dict[str, Any]:
    return {
        "device_id": device.device_id,
        "kind": device.kind,
        "name": device.name,
        "method": device.method,
        "measured": device.measured,
        "relative_uncertainty": device.relative_uncertainty,
        "site": device.site_id,
        "idle_power_w": device.idle_power_w,
        "embodied_kg_co2e": device.embodied_kg_co2e,
        "lifetime_years": device.lifetime_years,
    }


@doc("Devices in your sites")
@api_view(["GET"])
@permission_classes(READ_ADMIN_WRITES)
def devices(request: Request) -> Response:
    mine = Device.objects.filter(site__organization_id=organization_id(request)).order_by("device_id")
    return Response({"results": [_device_json(d) for d in mine]})


@doc("One device of your sites; PATCH places it and declares embodied emissions", request=DeviceSerializer)
@api_view(["GET", "PATCH"])
@permission_classes(READ_ADMIN_WRITES)
@parser_classes([JSONParser])
def device_detail(request: Request, device_id: str) -> Response:
    org_id = organization_id(request)
    mine = Device.objects.filter(site__organization_id=org_id)
    device = mine.filter(device_id=device_id).first()
    if device is None:
        raise NotFound(f"no device '{device_id}' in your organization's sites")
    if request.method == "GET":
        return Response(_device_json(device))
    form = DeviceSerializer(data=request.data)
    form.is_valid(raise_exception=True)
    data = dict(form.validated_data)
    site = None
    if "site" in data:
        site = Site.objects.filter(organization_id=org_id, pk=data.pop("site")).first()
        if site is None:
            raise ValidationError({"site": "no such site in your organization"})
    try:
        services.device_update(device=device, site=site, **data)
    except ServiceError as exc:
        raise _bad(exc) from None
    return Response(_device_json(device))


# -- rollups and the carbon summary ----------------------------------------------------------------


@doc(
    "Time series from the hourly rollups",
    query=(
        *PERIOD,
        ("step", "str", "hour, day or month"),
        ("model", "str", "only this model (idle energy, at no model, is then left out)"),
        ("site", "int", "only devices of this site (id)"),
    ),
)
@api_view(["GET"])
@permission_classes(READ_ADMIN_WRITES)
def rollups(request: Request) -> Response:
    """Time series from the hourly rollups: ``step`` hour, day or month; UTC."""
    org_id = organization_id(request)
    start, end = _period(request)
    step = request.query_params.get("step", "day")
    if step not in ROLLUP_STEPS:
        raise ValidationError({"step": f"must be hour, day or month, got {step!r}"})
    model = request.query_params.get("model") or None
    if model is not None and len(model) > limits.MODEL_NAME_MAX_LENGTH:
        raise ValidationError({"model": f"at most {limits.MODEL_NAME_MAX_LENGTH} characters"})
    site = request.query_params.get("site") or None
    # ASCII digits only and within a 64-bit id: str.isdigit() also takes "²" and numbers past the column.
    if site is not None and not re.fullmatch(r"[0-9]{1,18}", site):
        raise ValidationError({"site": "must be a site id"})
    series = rollup_series(org_id, start, end, step, model=model, site_id=int(site) if site else None)
    return Response(
        {
            "start": start.isoformat(),
            "end": end.isoformat(),
            "step": step,
            "results": [
                {
                    "t": row["t"].isoformat(),
                    "requests": row["requests"],
                    "energy_kwh": row["energy_uj"] / 3.6e12,
                    "idle_kwh": row["idle_uj"] / 3.6e12,
                    "location_co2e_g": row["location_co2e_g"],
                    "market_co2e_g": row["market_co2e_g"],
                }
                for row in series
            ],
        }
    )


def _total(total: co2e.Total) -> dict[str, Any]:
    rounded = total.rounded()
    return {
        "energy_kwh": rounded.energy_kwh,
        "co2e_g": rounded.co2e_g,
        "uncertainty_g": rounded.uncertainty_g,
        "relative_uncertainty": rounded.relative_uncertainty,
    }


@doc(
    "Location- and market-based totals, by category (Scope 2, Scope 3 category 1), SCI, factors", query=PERIOD
)
@api_view(["GET"])
@permission_classes(READ_ADMIN_WRITES)
def carbon(request: Request) -> Response:
    """Location- and market-based CO2e side by side: ``total`` covers every category; ``by_category`` gives
    ``scope2`` (Scope 2, ISO 14064-1 Category 2: owned and colocated sites) and ``scope3_cat1`` (Scope 3
    category 1, ISO 14064-1 Category 4: cloud inference) apart. Also SCI and the factors used, with
    attribution."""
    start, end = _period(request)
    try:
        summary = carbon_summary(organization_id(request), start, end)
    except (co2e.NoFactor, co2e.AmbiguousFactor, ValueError, ArithmeticError) as exc:
        # The inputs on file cannot value the period (a zone without a factor, two versions that tie...):
        # the client's request is fine, the organization's data must change first.
        return Response({"error": f"the emissions of this period cannot be computed: {exc}"}, status=409)
    return Response(
        {
            "start": start.isoformat(),
            "end": end.isoformat(),
            "requests": summary.requests,
            "it_energy_kwh": co2e.report_kwh(Decimal(summary.energy_uj).scaleb(-6) / co2e.J_PER_KWH),
            "idle_energy_kwh": co2e.report_kwh(Decimal(summary.idle_uj).scaleb(-6) / co2e.J_PER_KWH),
            "measured_share": (summary.measured_uj / summary.energy_uj) if summary.energy_uj else None,
            "location_based": {
                "total": _total(summary.location.total),
                "by_category": {k: _total(v) for k, v in summary.location.by_category.items()},
            },
            "market_based": {
                "total": _total(summary.market.total),
                "by_category": {k: _total(v) for k, v in summary.market.by_category.items()},
                "instruments_used": [
                    {"instrument_id": u.instrument.instrument_id, "covered_mwh": u.covered_mwh}
                    for u in summary.market.instruments_used
                ],
                "excluded": [
                    {"instrument_id": e.instrument.instrument_id, "reasons": list(e.reasons)}
                    for e in summary.market.excluded
                ],
                "disclosures": list(summary.market.disclosures),
            },
            "sci_g_per_request": summary.sci_g_per_request,
            "sci_g_per_1000_requests": None
            if summary.sci_g_per_request is None
            else co2e.report_g(summary.sci_g_per_request * 1000),
            "embodied_g": co2e.report_g(summary.embodied_g),
            "factors": [
                {**record, "notes": []}
                for record in sorted(summary.factor_records.values(), key=lambda r: (r["zone"], r["id"]))
            ],
            "not_valued": summary.not_valued,
        }
    )
