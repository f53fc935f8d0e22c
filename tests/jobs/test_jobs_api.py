"""The jobs API: submit (multipart), list, detail with window, progress, emissions and counterfactual,
outputs as JSON Lines, retry; every bad input refused with a message naming what is wrong; scopes; another
organization's job answers 404 on every job route."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from carbon import services as carbon
from jobs import services
from jobs.models import Job
from tenancy.models import Organization
from tests.factories import OrganizationFactory
from tests.jobs.conftest import FakeGateway, job_file, key_for

pytestmark = pytest.mark.django_db


def client_for(org: Organization, scopes: str = "infer,read") -> APIClient:
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key_for(org, scopes)}")
    return client


def post_job(client: APIClient, data: bytes | None = None, **fields: Any) -> Any:
    body: dict[str, Any] = {
        "file": SimpleUploadedFile("job.jsonl", job_file(3) if data is None else data),
        "model": "linear",
        "deadline": (datetime.now(UTC) + timedelta(hours=2)).isoformat(),
        **fields,
    }
    return client.post("/api/v1/jobs", {k: v for k, v in body.items() if v is not None}, format="multipart")


@pytest.fixture(autouse=True)
def _factors(db: None) -> None:
    carbon.load_shipped_factors()


def test_a_job_is_submitted_listed_and_shown_with_its_window(org: Organization) -> None:
    client = client_for(org)
    created = post_job(client)
    assert created.status_code == 202, created.json()
    body = created.json()
    assert body["status"] == "queued" and body["model"] == "linear" and body["version"] is None
    assert body["progress"] == {"requests": 3, "answered": 0, "percent": 0}
    assert body["window"]["source"] == "annual factor" and "runs at once" in body["window"]["why"]
    assert body["window"]["site"]["zone"] == "FR"
    assert body["emissions"]["status"] == "pending" and body["counterfactual"] is None
    assert body["input"]["requests"] == 3 and body["input"]["name"] == "job.jsonl"
    listed = client.get("/api/v1/jobs").json()["results"]
    assert [j["id"] for j in listed] == [body["id"]]
    detail = client.get(f"/api/v1/jobs/{body['id']}")
    assert detail.status_code == 200 and detail.json()["window"] == body["window"]


def test_a_finished_job_shows_its_outputs_as_json_lines_and_its_progress(
    org: Organization, fake_gateway: FakeGateway
) -> None:
    client = client_for(org)
    job_id = post_job(client).json()["id"]
    services.job_run(job_id)
    detail = client.get(f"/api/v1/jobs/{job_id}").json()
    assert detail["status"] == "done" and detail["progress"]["percent"] == 100
    assert detail["emissions"]["status"] == "pending"  # the stand-in gateway writes no ledger
    outputs = client.get(f"/api/v1/jobs/{job_id}/outputs")
    assert outputs.status_code == 200 and outputs["Content-Type"] == "application/jsonl"
    lines = [orjson.loads(line) for line in b"".join(outputs.streaming_content).splitlines()]
    assert [line["index"] for line in lines] == [0, 1, 2] and [line["line"] for line in lines] == [1, 2, 3]
    assert all(line["ledger_id"] == line["response"]["parameters"]["ledger_id"] for line in lines)


@pytest.mark.parametrize(
    ("fields", "data", "status", "message"),
    [
        ({"deadline": "2020-01-01T00:00:00Z"}, None, 400, "is in the past"),
        ({"deadline": "soon"}, None, 400, "Datetime has wrong format"),
        ({"deadline": None}, None, 400, "This field is required"),
        ({"model": "nosuchmodel"}, None, 400, "unknown model 'nosuchmodel'"),
        ({"model": None}, None, 400, "This field is required"),
        ({"version": "9"}, None, 400, "has no version '9'"),
        ({}, b"{oops\n", 400, "line 1: failed to parse the request JSON"),
        ({}, b"", 400, "holds no request"),
        ({"file": None}, None, 400, "No file was submitted"),
    ],
)
def test_bad_input_is_refused_with_a_message_naming_what_is_wrong(
    org: Organization, fields: dict[str, Any], data: bytes | None, status: int, message: str
) -> None:
    response = post_job(client_for(org), data, **fields)
    assert response.status_code == status
    assert message in orjson.dumps(response.json()).decode()
    assert not Job.objects.exists()


def test_a_deadline_too_soon_to_run_is_refused(org: Organization) -> None:
    soon = (datetime.now(UTC) + timedelta(seconds=20)).isoformat()
    response = post_job(client_for(org), deadline=soon)
    assert response.status_code == 400 and "too soon to run the job" in response.json()["error"]


def test_a_file_over_the_size_bound_is_refused_with_413(org: Organization, settings: Any) -> None:
    settings.JOBS_MAX_FILE_BYTES = 2048
    response = post_job(client_for(org), job_file(3))
    assert response.status_code == 413 and "JOBS_MAX_FILE_BYTES" in response.json()["error"]


def test_too_many_requests_are_refused(org: Organization, settings: Any) -> None:
    settings.JOBS_MAX_REQUESTS = 2
    response = post_job(client_for(org), job_file(3))
    assert response.status_code == 400 and "JOBS_MAX_REQUESTS" in response.json()["error"]


def test_scopes_read_to_see_and_infer_or_admin_to_submit(org: Organization) -> None:
    reader = client_for(org, "read")
    refused = post_job(reader)
    assert refused.status_code == 403 and "'infer' or 'admin' scope" in refused.json()["detail"]
    assert reader.get("/api/v1/jobs").status_code == 200
    assert post_job(client_for(org, "admin,read")).status_code == 202
    infer_only = client_for(org, "infer")
    assert infer_only.get("/api/v1/jobs").status_code == 403
    assert APIClient().get("/api/v1/jobs").status_code == 401


def test_retry_of_a_job_that_has_not_failed_is_a_conflict(org: Organization) -> None:
    client = client_for(org)
    job_id = post_job(client).json()["id"]
    response = client.post(f"/api/v1/jobs/{job_id}/retry")
    assert response.status_code == 409 and "only a failed job can be retried" in response.json()["error"]


def test_a_failed_job_is_retried_over_the_api(org: Organization, settings: Any) -> None:
    client = client_for(org)
    job_id = post_job(client).json()["id"]
    settings.GATEWAY_URL = "http://127.0.0.1:9"
    services.job_run(job_id)
    failed = client.get(f"/api/v1/jobs/{job_id}").json()
    assert failed["status"] == "failed" and "the gateway did not answer" in failed["failure_reason"]
    retried = client.post(f"/api/v1/jobs/{job_id}/retry")
    assert retried.status_code == 202 and retried.json()["status"] == "queued"


def test_another_organization_s_job_answers_404_on_every_job_route(org: Organization) -> None:
    job_id = post_job(client_for(org)).json()["id"]
    other = client_for(OrganizationFactory(), "infer,read,admin")
    for url in (f"/api/v1/jobs/{job_id}", f"/api/v1/jobs/{job_id}/outputs"):
        response = other.get(url)
        assert response.status_code == 404 and "no job" in response.json()["detail"]
    assert other.post(f"/api/v1/jobs/{job_id}/retry").status_code == 404
    assert other.get("/api/v1/jobs").json()["results"] == []
    assert other.get("/api/v1/jobs/99999999999999999999").status_code == 404
    assert Job.objects.get(pk=job_id).status == Job.Status.QUEUED
