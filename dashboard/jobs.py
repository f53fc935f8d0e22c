"""Dashboard pages of deferred jobs: the organization's jobs and a submission form (admin role), and one job
with its window and why, progress, emissions and the counterfactual estimate, and a retry when it failed."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.views.decorators.http import require_POST

from dashboard.access import can, member, organization_id, render_page
from dashboard.forms import JobForm
from jobs import selectors
from jobs.inputs import file_too_large
from jobs.models import Job
from jobs.services import job_retry, job_submit
from tenancy.services import ServiceError


def _job(request: HttpRequest, pk: int) -> Job:
    job = selectors.job_of(organization_id(request), pk)
    if job is None:
        raise Http404(f"no job {pk} in your organization")
    return job


@member
def jobs_page(request: HttpRequest) -> HttpResponse:
    form = JobForm(request.POST or None, request.FILES or None)
    if request.method == "POST":
        if not can(request, "admin"):
            raise PermissionDenied("submitting jobs needs the admin role")
        if form.is_valid():
            upload = form.cleaned_data["file"]
            too_large = file_too_large(upload.size or 0, settings.JOBS_MAX_FILE_BYTES)
            if too_large:
                form.add_error("file", too_large)
            else:
                try:
                    job = job_submit(
                        organization=request.membership.organization,  # type: ignore[attr-defined]
                        data=upload.read(),
                        model=form.cleaned_data["model"],
                        version=form.cleaned_data["version"],
                        deadline=form.cleaned_data["deadline"],
                        input_name=upload.name or "",
                        submitted_by=f"user:{request.user}",
                    )
                except ServiceError as exc:
                    form.add_error(None, str(exc))
                else:
                    messages.success(request, f"Job {job.pk} accepted: {job.plan.get('reason', '')}")
                    return HttpResponseRedirect(f"/dashboard/jobs/{job.pk}")
    jobs = selectors.jobs_of(organization_id(request), limit=100)
    return render_page(request, "dashboard/jobs.html", "jobs", form=form, jobs=jobs)


@member
def job_page(request: HttpRequest, pk: int) -> HttpResponse:
    job = _job(request, pk)
    emissions, counterfactual = selectors.job_emissions(job).parts()
    return render_page(
        request,
        "dashboard/job.html",
        "jobs",
        job=job,
        plan=job.plan,
        emissions=emissions,
        counterfactual=counterfactual,
        percent=selectors.progress_percent(job),
    )


@member  # first: an anonymous visitor is sent to the login page whatever the method
@require_POST
def job_retry_page(request: HttpRequest, pk: int) -> HttpResponse:
    if not can(request, "admin"):
        raise PermissionDenied("retrying jobs needs the admin role")
    job = _job(request, pk)
    try:
        job = job_retry(job=job)
    except ServiceError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Job {job.pk} will run again: {job.plan.get('reason', '')}")
    return HttpResponseRedirect(f"/dashboard/jobs/{job.pk}")
