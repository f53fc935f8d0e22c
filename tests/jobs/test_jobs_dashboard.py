"""The dashboard's jobs pages through Django's test client: the list and the submission form (admin only),
every refusal shown next to the form, a job's window, candidates, emissions and the counterfactual estimate,
retry of a failed job, and another organization's job answering 404."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from carbon import services as carbon
from jobs import services
from jobs.models import Job, JobOutput
from ledger.writer import default_site
from tenancy.models import Device, Organization
from tests.factories import LedgerRequestEnergyFactory, LedgerRequestFactory, OrganizationFactory
from tests.jobs.conftest import H10, NOW, job_file
from tests.support.accounts import signed_in

pytestmark = pytest.mark.django_db


def login(org: Organization, role: str) -> Client:
    return signed_in(org, role)


def form(data: bytes | None = None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "file": SimpleUploadedFile("batch.jsonl", job_file(3) if data is None else data),
        "model": "linear",
        "version": "",
        "deadline": (datetime.now(UTC) + timedelta(hours=3)).strftime("%Y-%m-%d %H:%M"),
        **fields,
    }
    return {k: v for k, v in body.items() if v is not None}


@pytest.fixture(autouse=True)
def _factors(db: None) -> None:
    carbon.load_shipped_factors()


def test_an_admin_submits_a_job_from_the_dashboard_and_sees_its_window(org: Organization) -> None:
    client = login(org, "admin")
    listing = client.get("/dashboard/jobs")
    assert listing.status_code == 200 and 'id="job-form"' in listing.content.decode()
    assert "No job yet." in listing.content.decode()
    response = client.post("/dashboard/jobs", form())
    job = Job.objects.get(organization=org)
    assert response.status_code == 302 and response["Location"] == f"/dashboard/jobs/{job.pk}"
    assert job.request_count == 3 and job.input_name == "batch.jsonl" and job.submitted_by.startswith("user:")
    page = client.get(f"/dashboard/jobs/{job.pk}").content.decode()
    assert f"Job {job.pk}: linear" in page
    assert "runs at once" in page and "annual factor" in page  # the window and why
    assert 'id="job-candidates"' in page and "(chosen)" in page
    assert "pending: the job has not run yet" in page
    assert f"Job {job.pk} accepted" in page  # the message after the redirect
    listed = client.get("/dashboard/jobs").content.decode()
    assert f'data-job="{job.pk}"' in listed and "0 / 3" in listed


@pytest.mark.parametrize(
    ("fields", "data", "message"),
    [
        ({"deadline": "2020-01-01 00:00"}, None, "is in the past"),
        ({"deadline": "soon"}, None, "Enter a valid date/time."),
        ({"model": "nosuchmodel"}, None, "unknown model &#x27;nosuchmodel&#x27;"),
        ({"version": "9"}, None, "has no version &#x27;9&#x27;"),
        ({}, b"{oops\n", "line 1: failed to parse the request JSON"),
        ({"file": None}, None, "This field is required."),
    ],
)
def test_a_bad_submission_is_refused_next_to_the_form(
    org: Organization, fields: dict[str, Any], data: bytes | None, message: str
) -> None:
    response = login(org, "admin").post("/dashboard/jobs", form(data, **fields))
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Job.objects.exists()


def test_a_file_over_the_size_bound_is_refused_by_name(org: Organization, settings: Any) -> None:
    settings.JOBS_MAX_FILE_BYTES = 100
    response = login(org, "admin").post("/dashboard/jobs", form())
    assert "at most 100 (JOBS_MAX_FILE_BYTES)" in response.content.decode()
    assert not Job.objects.exists()


def test_a_viewer_sees_jobs_but_cannot_submit_or_retry(org: Organization) -> None:
    job = services.job_submit(
        organization=org, data=job_file(2), model="linear", deadline=NOW + timedelta(hours=3), now=NOW
    )
    Job.objects.filter(pk=job.pk).update(status=Job.Status.FAILED, failure_reason="gateway down")
    client = login(org, "viewer")
    listing = client.get("/dashboard/jobs").content.decode()
    assert 'id="job-form"' not in listing and "failed: gateway down" in listing
    assert client.post("/dashboard/jobs", form()).status_code == 403
    page = client.get(f"/dashboard/jobs/{job.pk}").content.decode()
    assert "Retry the job" not in page
    assert client.post(f"/dashboard/jobs/{job.pk}/retry").status_code == 403
    assert Job.objects.get(pk=job.pk).status == Job.Status.FAILED


def test_an_admin_retries_a_failed_job_and_a_job_that_did_not_fail_is_refused(org: Organization) -> None:
    job = services.job_submit(
        organization=org, data=job_file(2), model="linear", deadline=NOW + timedelta(hours=3), now=NOW
    )
    client = login(org, "admin")
    refused = client.post(f"/dashboard/jobs/{job.pk}/retry", follow=True).content.decode()
    assert "only a failed job can be retried" in refused
    Job.objects.filter(pk=job.pk).update(status=Job.Status.FAILED, failure_reason="gateway down")
    assert "Retry the job" in client.get(f"/dashboard/jobs/{job.pk}").content.decode()
    done = client.post(f"/dashboard/jobs/{job.pk}/retry", follow=True).content.decode()
    assert f"Job {job.pk} will run again" in done
    assert Job.objects.get(pk=job.pk).status in (Job.Status.QUEUED, Job.Status.SCHEDULED)
    assert client.get(f"/dashboard/jobs/{job.pk}/retry").status_code == 405


def test_a_finished_job_shows_its_emissions_and_the_labelled_counterfactual(
    org: Organization, series: None
) -> None:
    job = services.job_submit(
        organization=org, data=job_file(3), model="linear", deadline=H10 + timedelta(hours=4), now=NOW
    )
    site = default_site()
    Device.objects.create(
        device_id="cpu-model", kind="cpu", method="modelled", relative_uncertainty=0.3, site=site
    )
    carbon.site_set_pue(site=site, pue="1.5", source="declared", valid_from=datetime(2020, 1, 1, tzinfo=UTC))
    hour = H10 + timedelta(hours=2)
    started_ns = int(hour.timestamp()) * 1_000_000_000 + 5_000_000_000
    for i in range(3):
        request = LedgerRequestFactory(organization=org, started_ns=started_ns, received_ns=started_ns - 10)
        LedgerRequestEnergyFactory(request_id=request.request_id, energy_uj=1_200_000, final=True)
        JobOutput.objects.create(
            job=job, index=i, line=i + 1, ledger_id=request.request_id, response="{}", answered_at=hour
        )
    Job.objects.filter(pk=job.pk).update(status=Job.Status.DONE, done_requests=3)
    page = login(org, "viewer").get(f"/dashboard/jobs/{job.pk}").content.decode()
    # As checked by hand in test_jobs_services: 3.6 J x PUE 1.5 x 50 g/kWh; 300 g/kWh at submission.
    # Through the one number formatter (3-4 significant figures, the uncertainty in the value's unit).
    assert "3.6 J of IT energy" in page and "<strong>0.0000750 g ± " in page
    assert (
        "<strong>0.00045 g CO2e</strong>" in page and "avoided by the chosen window: 0.000375 g CO2e" in page
    )
    assert "estimate outside the inventory" in page
    assert "Download the outputs (JSON Lines)" in page and f"/api/v1/jobs/{job.pk}/outputs" in page


def test_another_organization_s_job_answers_404(org: Organization) -> None:
    job = services.job_submit(
        organization=org, data=job_file(2), model="linear", deadline=NOW + timedelta(hours=3), now=NOW
    )
    stranger = login(OrganizationFactory(), "admin")
    assert stranger.get(f"/dashboard/jobs/{job.pk}").status_code == 404
    assert stranger.post(f"/dashboard/jobs/{job.pk}/retry").status_code == 404
    assert f'data-job="{job.pk}"' not in stranger.get("/dashboard/jobs").content.decode()
