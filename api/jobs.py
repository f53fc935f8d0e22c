"""REST API of deferred inference jobs: submit one (multipart), list, watch one (window, progress, result,
emissions and the counterfactual estimate), stream its outputs as JSON Lines, retry a failed one. Another
organization's job answers 404."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
from django.conf import settings
from django.http import StreamingHttpResponse
from rest_framework import permissions, serializers, status
from rest_framework.decorators import api_view, parser_classes, permission_classes
from rest_framework.exceptions import NotFound
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from api.helpers import InstantField, organization_id
from api.openapi import doc
from jobs import selectors
from jobs.inputs import file_too_large
from jobs.models import Job
from jobs.services import job_retry, job_submit
from tenancy.access import organization_of, scopes_of
from tenancy.services import ServiceError


class JobPermission(permissions.BasePermission):
    """Reading needs the 'read' scope; submitting or retrying needs 'infer' (the job runs inferences) or
    'admin'."""

    def has_permission(self, request: Request, view: Any) -> bool:
        scopes = scopes_of(request.user)
        if request.method in permissions.SAFE_METHODS:
            self.message = "this API key or account lacks the 'read' scope"
            return "read" in scopes
        self.message = "submitting or retrying jobs needs an API key with the 'infer' or 'admin' scope"
        return bool({"infer", "admin"} & scopes)


_PERMS = [permissions.IsAuthenticated, JobPermission]


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def job_json(job: Job, *, detail: bool = False) -> dict[str, Any]:
    plan = job.plan if detail else {}
    body: dict[str, Any] = {
        "id": job.pk,
        "model": job.model,
        "version": job.version or None,
        "status": job.status,
        "submitted_at": _iso(job.submitted_at),
        "deadline": _iso(job.deadline),
        "planned_start": _iso(job.planned_start),
        "started_at": _iso(job.started_at),
        "finished_at": _iso(job.finished_at),
        "progress": {
            "requests": job.request_count,
            "answered": job.done_requests,
            "percent": selectors.progress_percent(job),
        },
        "failure_reason": job.failure_reason,
        "attempts": job.attempts,
        "url": f"/api/v1/jobs/{job.pk}",
        "outputs_url": f"/api/v1/jobs/{job.pk}/outputs",
    }
    if detail:
        body["window"] = {
            "start": plan.get("start"),
            "hour": plan.get("hour"),
            "intensity_g_per_kwh": plan.get("intensity_g_per_kwh"),
            "source": plan.get("source"),
            "source_note": plan.get("source_note"),
            "why": plan.get("reason"),
            "latest_start": plan.get("latest_start"),
            "site": plan.get("site"),
            "notes": plan.get("notes", []),
            "candidates": plan.get("candidates", []),
        }
        body["input"] = {
            "name": job.input_name,
            "bytes": job.input_bytes,
            "sha256": job.input_sha256,
            "requests": job.request_count,
        }
        body["result"] = {
            "answered": job.done_requests,
            "requests": job.request_count,
            "complete": job.status == Job.Status.DONE,
            "outputs_url": f"/api/v1/jobs/{job.pk}/outputs",
            "format": "JSON Lines: {index, line, ledger_id, response} per answered request, in the file's order",
        }
        emissions, counterfactual = selectors.job_emissions(job).parts()
        body["counterfactual"] = counterfactual
        body["emissions"] = emissions
    return body


class JobSubmitSerializer(serializers.Serializer[Any]):
    file = serializers.FileField(
        help_text="JSON Lines: one KServe v2 infer request body (JSON) per line", allow_empty_file=True
    )
    model = serializers.CharField(max_length=128, help_text="a model of the model repository")
    version = serializers.CharField(max_length=32, required=False, allow_blank=True, default="")
    deadline = InstantField(help_text="ISO 8601 date-time with a zone (UTC if none)")


def _mine(request: Request, pk: int) -> Job:
    job = selectors.job_of(organization_id(request), pk)
    if job is None:
        raise NotFound(f"no job {pk} in your organization")
    return job


@doc(
    "Your jobs; POST submits one (multipart: file, model, version, deadline), run in the lowest-intensity "
    "window before its deadline",
    request=JobSubmitSerializer,
)
@api_view(["GET", "POST"])
@permission_classes(_PERMS)
@parser_classes([MultiPartParser, FormParser])
def jobs(request: Request) -> Response:
    org_id = organization_id(request)
    if request.method == "GET":
        return Response({"results": [job_json(j) for j in selectors.jobs_of(org_id)]})
    form = JobSubmitSerializer(data=request.data)
    form.is_valid(raise_exception=True)
    upload = form.validated_data["file"]
    too_large = file_too_large(upload.size or 0, settings.JOBS_MAX_FILE_BYTES)
    if too_large:
        return Response({"error": too_large}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    try:
        job = job_submit(
            organization=organization_of(request.user),
            data=upload.read(),
            model=form.validated_data["model"],
            version=form.validated_data["version"],
            deadline=form.validated_data["deadline"],
            input_name=upload.name or "",
            submitted_by=str(request.user),
        )
    except ServiceError as exc:
        return Response({"error": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
    return Response(job_json(job, detail=True), status=status.HTTP_202_ACCEPTED)


@doc("A job: status, chosen window and why, progress, result, emissions and the counterfactual estimate")
@api_view(["GET"])
@permission_classes(_PERMS)
def job_detail(request: Request, pk: int) -> Response:
    return Response(job_json(_mine(request, pk), detail=True))


@doc("The answered requests of a job as JSON Lines (streamed, in the file's order)")
@api_view(["GET"])
@permission_classes(_PERMS)
def job_outputs(request: Request, pk: int) -> StreamingHttpResponse:
    job = _mine(request, pk)

    def lines() -> Iterator[bytes]:
        chunk: list[bytes] = []
        for index, line, ledger_id, response in selectors.output_lines(job):
            head = orjson.dumps({"index": index, "line": line, "ledger_id": ledger_id})
            chunk.append(head[:-1] + b',"response":' + response.encode() + b"}\n")
            if len(chunk) >= 200:
                yield b"".join(chunk)
                chunk.clear()
        if chunk:
            yield b"".join(chunk)

    response = StreamingHttpResponse(lines(), content_type="application/jsonl")
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-outputs.jsonl"'
    response["X-Job-Status"] = job.status
    return response


@doc("Run a failed job again (the requests already answered are kept)")
@api_view(["POST"])
@permission_classes(_PERMS)
def job_retry_view(request: Request, pk: int) -> Response:
    try:
        job = job_retry(job=_mine(request, pk))
    except ServiceError as exc:
        return Response({"error": str(exc)}, status=status.HTTP_409_CONFLICT)
    return Response(job_json(job, detail=True), status=status.HTTP_202_ACCEPTED)
