"""A factor file with a great many bad rows is rejected with the first 100 problems and the total count: the
answer, the stored import and every later listing stay small whatever the file holds."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from rest_framework.test import APIClient

from carbon import services as carbon
from carbon.intensity_csv import IntensityImportError, parse_intensity_csv
from carbon.models import FactorImport
from tenancy.models import Organization
from tenancy.services import api_key_create, user_create
from tests.factories import OrganizationFactory
from tests.support.accounts import PASSWORD

pytestmark = pytest.mark.django_db

API = "/api/v1"
BAD_ROWS = 20_000
KEPT = 100


def _bad_file(rows: int = BAD_ROWS) -> bytes:
    """``rows`` rows, each with one problem (a negative figure), after a header: lines 2 to rows + 1."""
    return b"zone,datetime,g_co2e_per_kwh\n" + b"".join(
        f"FR,{2001 + i // 8760}-01-01T00:00:00Z,-{i + 1}\n".encode() for i in range(rows)
    )


@pytest.fixture
def org() -> Organization:
    carbon.load_shipped_factors()
    return OrganizationFactory()


def test_the_parser_keeps_the_first_problems_in_line_order_and_counts_them_all() -> None:
    text = "zone,datetime,g_co2e_per_kwh\n" + "".join(
        f"FR,2024-03-01T{h % 24:02d}:00:00Z,x{h}\n" for h in range(KEPT * 3)
    )
    with pytest.raises(IntensityImportError) as caught:
        parse_intensity_csv(text)
    error = caught.value
    assert len(error.errors) == KEPT
    assert [e.line for e in error.errors] == list(range(2, KEPT + 2))
    assert error.count == KEPT * 3
    assert str(error).startswith(f"intensity CSV rejected, nothing imported: {KEPT * 3} problems on")


def test_a_rejected_import_stores_the_first_100_problems_and_the_total(org: Organization) -> None:
    record = carbon.factor_import_csv(data=_bad_file(), name="bad.csv", organization=org)
    assert record.status == FactorImport.Status.REJECTED
    kept, total = carbon.import_errors(record)
    assert total == BAD_ROWS
    assert [e["line"] for e in kept] == list(range(2, KEPT + 2))
    assert all("negative" in e["reason"] for e in kept)
    stored = FactorImport.objects.get(pk=record.pk).errors
    assert len(json.dumps(stored)) < 50_000


def test_the_api_answers_the_first_100_problems_and_the_count_and_lists_no_more(org: Organization) -> None:
    client = APIClient(raise_request_exception=False)
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=org, scopes='read,admin').raw_key}"
    )
    data = _bad_file()
    response = client.post(
        f"{API}/factor-imports",
        {"file": SimpleUploadedFile("bad.csv", data, content_type="text/csv")},
        format="multipart",
    )
    assert response.status_code == 422
    assert len(response.content) < 50_000
    body = response.json()
    assert f"{BAD_ROWS} row(s) rejected" in body["error"]
    assert body["import"]["error_count"] == BAD_ROWS
    assert [e["line"] for e in body["import"]["errors"]] == list(range(2, KEPT + 2))

    listed = client.get(f"{API}/factor-imports")
    assert listed.status_code == 200 and len(listed.content) < 100_000
    mine = [r for r in listed.json()["results"] if r["id"] == body["import"]["id"]]
    assert len(mine[0]["errors"]) == KEPT and mine[0]["error_count"] == BAD_ROWS
    detail = client.get(f"{API}/factor-imports/{body['import']['id']}").json()
    assert len(detail["errors"]) == KEPT and detail["error_count"] == BAD_ROWS


def test_the_dashboard_names_the_total_count_of_problems(org: Organization) -> None:
    user_create(organization=org, username="uploader", password=PASSWORD, role="admin")
    client = Client(raise_request_exception=False)
    assert client.login(username="uploader", password=PASSWORD)
    response = client.post(
        "/dashboard/settings",
        {
            "action": "upload",
            "upload-file": SimpleUploadedFile("bad.csv", _bad_file(), content_type="text/csv"),
        },
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert f"{BAD_ROWS} row(s) rejected" in page
    assert len(response.content) < 200_000
