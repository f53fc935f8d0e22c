"""Job files go through the gateway's codec (jobs/inputs.py), so what the gateway refuses with a 400 a job
submission refuses by line, through the API and the dashboard, never with a 500 (issue 22)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from carbon import services as carbon
from inference.config import load_config
from jobs.inputs import JobInputError, parse_job_file
from jobs.models import Job
from tenancy.models import Organization
from tests.jobs.conftest import DEMO_REPOSITORY, infer_line, key_for
from tests.support.accounts import signed_in

BOUNDS = {"max_requests": 50, "max_file_bytes": 1_000_000, "max_body_bytes": 64 * 1024 * 1024}


def _line(**changes: Any) -> bytes:
    doc = orjson.loads(infer_line(0))
    tensor = doc["inputs"][0]
    for key, value in changes.items():
        if key in ("id", "parameters", "outputs"):
            doc[key] = value
        else:
            tensor[key] = value
    return orjson.dumps(doc)


BAD_LINES = [
    pytest.param(_line(datatype=["FP32"]), "datatype", id="datatype-list"),
    pytest.param(_line(datatype={"FP32": 1}), "datatype", id="datatype-object"),
    pytest.param(_line(id="r" * 257), "'id'", id="id-too-long"),
    pytest.param(_line(id="a\u0000b"), "'id'", id="id-nul"),
    pytest.param(_line(shape=[1, 2**62]), "input 'x'", id="shape-huge"),
    pytest.param(_line(shape=[1, True]), "shape", id="shape-bool"),
    pytest.param(_line(parameters=[]), "'parameters'", id="parameters-list"),
    pytest.param(
        _line(outputs=[{"name": "y", "parameters": {"binary_data": "no"}}]), "binary_data", id="out-bin"
    ),
    pytest.param(_line(data=[0.5] * 255 + [3.4e39]), "FP32", id="fp32-overflow"),
]


@pytest.mark.parametrize(("line", "field"), BAD_LINES)
def test_a_job_line_the_gateway_would_refuse_is_refused_naming_its_line_and_field(
    line: bytes, field: str
) -> None:
    spec = load_config(DEMO_REPOSITORY / "linear")
    with pytest.raises(JobInputError) as info:
        parse_job_file(infer_line(1) + b"\n" + line + b"\n", spec, **BOUNDS)
    assert str(info.value).startswith("line 2: ") and field in str(info.value)


def _deadline() -> datetime:
    return datetime.now(UTC) + timedelta(hours=3)


@pytest.mark.django_db
def test_a_job_file_with_a_list_datatype_is_a_400_through_the_api(org: Organization) -> None:
    carbon.load_shipped_factors()
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key_for(org)}")
    upload = SimpleUploadedFile("job.jsonl", _line(datatype=["FP32"]) + b"\n")
    response = client.post(
        "/api/v1/jobs",
        {"file": upload, "model": "linear", "deadline": _deadline().isoformat()},
        format="multipart",
    )
    assert response.status_code == 400, response.content
    assert "line 1" in response.json()["error"] and "datatype" in response.json()["error"]
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_job_file_with_a_list_datatype_is_refused_next_to_the_dashboard_form(org: Organization) -> None:
    carbon.load_shipped_factors()
    client = signed_in(org, "admin")
    client.raise_request_exception = False
    upload = SimpleUploadedFile("batch.jsonl", _line(datatype=["FP32"]) + b"\n")
    response = client.post(
        "/dashboard/jobs",
        {
            "file": upload,
            "model": "linear",
            "version": "",
            "deadline": _deadline().strftime("%Y-%m-%d %H:%M"),
        },
    )
    assert response.status_code == 200
    assert "line 1" in response.content.decode() and "datatype" in response.content.decode()
    assert not Job.objects.exists()
