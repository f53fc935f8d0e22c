"""REST API of reports: request one, watch its progress, download its files (owning organization only)."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from rest_framework import permissions, serializers, status
from rest_framework.decorators import api_view, parser_classes, permission_classes
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from api.helpers import DayField, HasReadScope, organization_id
from api.openapi import doc
from api.parsers import JSONParser
from reports import selectors
from reports.models import Report, ReportFile
from reports.services import report_recalculate, report_request, report_retry
from tenancy.access import organization_of, scopes_of
from tenancy.services import ServiceError


class CanRequestReports(permissions.BasePermission):
    message = "requesting reports needs an API key with the 'admin' scope or the analyst or admin role"

    def has_permission(self, request: Request, view: Any) -> bool:
        return request.method in permissions.SAFE_METHODS or "report" in scopes_of(request.user)


_PERMS = [permissions.IsAuthenticated, HasReadScope, CanRequestReports]


def report_json(report: Report) -> dict[str, Any]:
    return {
        "id": report.pk,
        "period_start": report.period_start.isoformat(),
        "period_end": report.period_end.isoformat(),
        "kind": report.kind,
        "status": report.status,
        "progress": report.progress,
        "progress_message": report.progress_message,
        "failure_reason": report.failure_reason,
        "accept_broken_chain": report.accept_broken_chain,
        "replaces": report.replaces_id,
        "replacement_reason": report.replacement_reason,
        "inputs_sha256": report.inputs_sha256,
        "code_version": report.code_version,
        "requested_by": report.requested_by,
        "created_at": report.created_at.isoformat(),
        "finished_at": report.finished_at.isoformat() if report.finished_at else None,
        "files": [
            {
                "format": f.format,
                "filename": f.filename,
                "sha256": f.sha256,
                "size": f.size,
                "url": f"/api/v1/reports/{report.pk}/files/{f.format}",
            }
            for f in selectors.files_of(report)
        ],
    }


class ReportRequestSerializer(serializers.Serializer[Any]):
    start = DayField(help_text="first day of the period")
    end = DayField(help_text="day after the last day (exclusive)")
    accept_broken_chain = serializers.BooleanField(default=False)


class RecalculateSerializer(serializers.Serializer[Any]):
    reason = serializers.CharField(max_length=2000)


def _mine(request: Request, pk: int) -> Report:
    report = selectors.report_of(organization_id(request), pk)
    if report is None:
        raise NotFound(f"no report {pk} in your organization")
    return report


@doc(
    "Your reports; POST requests one (queued; asking twice while it runs returns the same)",
    request=ReportRequestSerializer,
)
@api_view(["GET", "POST"])
@permission_classes(_PERMS)
@parser_classes([JSONParser])
def reports(request: Request) -> Response:
    org_id = organization_id(request)
    if request.method == "GET":
        return Response({"results": [report_json(r) for r in selectors.reports_of(org_id)]})
    form = ReportRequestSerializer(data=request.data)
    form.is_valid(raise_exception=True)
    try:
        report = report_request(
            organization=organization_of(request.user),
            start=form.validated_data["start"],
            end=form.validated_data["end"],
            accept_broken_chain=form.validated_data["accept_broken_chain"],
            requested_by=str(request.user),
        )
    except ServiceError as exc:
        raise ValidationError({"error": str(exc)}) from None
    return Response(report_json(report), status=status.HTTP_202_ACCEPTED)


@doc("A report with its progress and files")
@api_view(["GET"])
@permission_classes(_PERMS)
def report_detail(request: Request, pk: int) -> Response:
    return Response(report_json(_mine(request, pk)))


@doc("Run a failed report again")
@api_view(["POST"])
@permission_classes(_PERMS)
def report_retry_view(request: Request, pk: int) -> Response:
    try:
        report = report_retry(report=_mine(request, pk))
    except ServiceError as exc:
        return Response({"error": str(exc)}, status=status.HTTP_409_CONFLICT)
    return Response(report_json(report), status=status.HTTP_202_ACCEPTED)


@doc("A new version of a finished report, with the reason", request=RecalculateSerializer)
@api_view(["POST"])
@permission_classes(_PERMS)
@parser_classes([JSONParser])
def report_recalculate_view(request: Request, pk: int) -> Response:
    form = RecalculateSerializer(data=request.data)
    form.is_valid(raise_exception=True)
    try:
        report = report_recalculate(
            report=_mine(request, pk), reason=form.validated_data["reason"], requested_by=str(request.user)
        )
    except ServiceError as exc:
        return Response({"error": str(exc)}, status=status.HTTP_409_CONFLICT)
    return Response(report_json(report), status=status.HTTP_202_ACCEPTED)


@doc("Download one file of a report (pdf, csv, json or esrs-e1: the ESRS E1 datapoints as CSV)")
@api_view(["GET"])
@permission_classes(_PERMS)
def report_file(request: Request, pk: int, fmt: str) -> HttpResponse:
    report = _mine(request, pk)
    if fmt not in ReportFile.FORMATS:
        raise NotFound(f"no format {fmt!r}; choose {', '.join(ReportFile.FORMATS)}")
    file = selectors.file_of(report, fmt)
    if file is None:
        raise NotFound(f"report {pk} has no {fmt} file (status: {report.status})")
    response = HttpResponse(bytes(file.content), content_type=ReportFile.CONTENT_TYPES[fmt])
    response["Content-Disposition"] = f'attachment; filename="{file.filename}"'
    response["X-Content-SHA256"] = file.sha256
    return response
