"""GHG reports: content checked in the PDF's extracted text, frozen snapshots, versions, failures, API."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import re
from datetime import UTC, date, datetime
from decimal import Decimal

import pypdf
import pytest
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from carbon import display
from carbon import services as carbon
from carbon.models import EmissionFactor
from carbon.rollups import recompute_carbon, rollups_update
from ledger.models import LedgerRequest
from ledger.writer import append_records
from reports.models import Report, ReportingProfile
from reports.render import render_csv, render_json
from reports.services import (
    report_generate,
    report_recalculate,
    report_request,
    report_retry,
    reports_monthly,
)
from tenancy.models import Device, Organization
from tenancy.services import api_key_create
from tests.factories import OrganizationFactory
from tests.support.ledger import one_request_records

pytestmark = pytest.mark.django_db

_ids = itertools.count(1)
JAN = (date(2025, 1, 1), date(2025, 2, 1))

# The ledger of `org_with_ledger`, valued by hand from the shipped figures:
#   FR, owned, PUE 1.2: 1 kWh IT -> 1.2 kWh x 41.44 g/kWh (Ember 2025)            = 49.728 g
#   US-VA, cloud, PUE 1.1: 0.5 kWh IT -> 0.55 kWh x 244.758 g/kWh (eGRID 2023)    = 134.6169 g
FR_G = Decimal("1.2") * Decimal("41.44")
VA_G = Decimal("0.55") * Decimal("244.758")
TOTAL_T = ((FR_G + VA_G).quantize(Decimal("0.001"))).scaleb(-6)


def _request(org: Organization, device: Device, at: datetime, energy_uj: int, model: str) -> None:
    n = next(_ids)
    t = int(at.timestamp() * 1e9)
    append_records("report-test", one_request_records("r", n, org.pk, device.device_id, t, energy_uj, model))


@pytest.fixture
def org_with_ledger() -> Organization:
    carbon.load_shipped_factors()
    org = OrganizationFactory(name="Acme Inference")
    ReportingProfile.objects.create(
        organization=org, responsible_person="Ada Lovelace", base_year=2024, description="Acme serves models."
    )
    fr = carbon.site_create(name=f"fr-{org.slug}", zone="FR", pue="1.2", organization=org)
    va = carbon.site_create(
        name=f"va-{org.slug}", zone="US-VA", pue="1.1", electricity="cloud", organization=org
    )
    gpu = Device.objects.create(
        device_id=f"gpu-{org.slug}",
        kind="gpu",
        method="nvml-counter",
        measured=True,
        relative_uncertainty=0.05,
        site=fr,
    )
    cpu = Device.objects.create(
        device_id=f"cpu-{org.slug}", kind="cpu", method="modelled", relative_uncertainty=0.3, site=va
    )
    _request(org, gpu, datetime(2025, 1, 10, 9, tzinfo=UTC), 3_600_000_000_000, "digits")
    _request(org, cpu, datetime(2025, 1, 20, 15, tzinfo=UTC), 1_800_000_000_000, "linear")
    rollups_update()
    return org


def _generate(org: Organization, **kwargs: object) -> Report:
    report = report_request(organization=org, start=JAN[0], end=JAN[1], **kwargs)  # type: ignore[arg-type]
    done = report_generate(report.pk)
    assert done is not None
    return done


def _pdf_text(report: Report) -> str:
    pdf = bytes(report.files.get(format="pdf").content)
    text = "\n".join(page.extract_text() for page in pypdf.PdfReader(io.BytesIO(pdf)).pages)
    return re.sub(r"\s+", " ", text)


def test_the_pdf_holds_every_element_iso_14064_1_asks_and_the_right_totals(
    org_with_ledger: Organization,
) -> None:
    report = _generate(org_with_ledger)
    assert report.status == "done", report.failure_reason
    text = _pdf_text(report)
    required = [
        "Acme Inference",  # organization
        "Acme serves models.",  # description
        "Ada Lovelace",  # responsible person
        "1\N{EN DASH}31 January 2025",  # reporting period, both days included
        "operational control",  # organizational boundary
        "Reporting boundary",  # reporting boundary
        "Significance threshold",
        "Category 2",  # emissions by ISO category
        "Category 4",
        "Location-based",  # Scope 2 both ways
        "Market-based",
        "Instruments excluded",
        "Exclusions",
        "Base year 2024",
        "Recalculation policy",
        "Quantification methods",
        "nvml-counter",
        "modelled",
        "Ember (2026), with major processing by Our World in Data",  # factors with source
        "CC BY 4.0",
        "US EPA eGRID2023",
        "lifecycle",  # basis
        "Global warming potentials",
        "AR6",
        "Uncertainty",
        "Approach 1",
        "ISO 14064-1:2018",  # statement of the standard
        "Departures",
        "Verification status",
        "SCI",
        "per 1,000",
        "Monthly trend",
        "Ledger integrity",
        "intact",
        "Page 1 of",
    ]
    missing = [item for item in required if item not in text]
    assert not missing, missing
    assert display.mass_g(TOTAL_T.scaleb(6)) in text  # location-based total, all categories
    assert "2025-01" in text and "digits" in text and "linear" in text  # breakdown by month and model


def test_the_snapshot_totals_match_a_hand_computation(org_with_ledger: Organization) -> None:
    snapshot = _generate(org_with_ledger).snapshot
    assert snapshot is not None
    results = snapshot["results"]
    assert Decimal(results["location_based"]["co2e_t"]) == TOTAL_T
    categories = {c["category"].split(":")[0]: c for c in results["categories"]}
    assert Decimal(categories["ISO 14064-1 Category 2"]["location_based"]["co2e_g"]) == FR_G
    assert Decimal(categories["ISO 14064-1 Category 4"]["location_based"]["co2e_g"]) == VA_G.quantize(
        Decimal("0.001")
    )
    assert results["requests"] == 2
    assert results["energy"]["it_energy_kwh"] == "1.500000"


def test_rendering_the_same_snapshot_again_gives_byte_identical_csv_and_json(
    org_with_ledger: Organization,
) -> None:
    report = _generate(org_with_ledger)
    stored = {f.format: bytes(f.content) for f in report.files.all()}
    assert render_csv(report.snapshot) == stored["csv"]
    assert render_json(report.snapshot) == stored["json"]
    assert json.loads(stored["json"])["inputs_sha256"] == report.inputs_sha256
    for file in report.files.all():
        assert file.sha256 == hashlib.sha256(bytes(file.content)).hexdigest()
    header = stored["csv"].decode().splitlines()[0]
    assert "co2e (t)" in header and "it_energy (kWh)" in header
    assert len(stored["csv"].decode().splitlines()) == 1 + 2 * 2  # 2 site x model x month lines x 2 methods


def test_a_later_factor_change_never_changes_a_report_and_a_recalculation_is_a_new_version(
    org_with_ledger: Organization,
) -> None:
    first = _generate(org_with_ledger)
    before = {f.format: bytes(f.content) for f in first.files.all()}
    carbon.factor_import_csv(
        data=b"zone,datetime,g_co2e_per_kwh\nFR,2025-01-10T09:00:00Z,10\n", name="fr.csv"
    )
    recompute_carbon(org_with_ledger.pk)
    first.refresh_from_db()
    assert {f.format: bytes(f.content) for f in first.files.all()} == before
    second = report_recalculate(report=first, reason="hourly French factors imported")
    second = report_generate(second.pk)
    assert second is not None and second.status == "done"
    assert second.replaces_id == first.pk
    assert second.snapshot["report"]["replacement_reason"] == "hourly French factors imported"
    assert Decimal(second.snapshot["results"]["location_based"]["co2e_g"]) == (
        Decimal("1.2") * 10 + VA_G
    ).quantize(Decimal("0.001"))
    assert second.inputs_sha256 != first.inputs_sha256
    assert f"replacing report {first.pk}" in _pdf_text(second)


def test_asking_twice_while_one_is_queued_gives_the_same_run(org_with_ledger: Organization) -> None:
    first = report_request(organization=org_with_ledger, start=JAN[0], end=JAN[1])
    assert report_request(organization=org_with_ledger, start=JAN[0], end=JAN[1]).pk == first.pk
    report_generate(first.pk)
    assert report_generate(first.pk).status == "done"  # a second run of the task changes nothing
    assert Report.objects.get(pk=first.pk).attempts == 1
    assert report_request(organization=org_with_ledger, start=JAN[0], end=JAN[1]).pk != first.pk


def test_an_unreadable_factor_fails_the_report_with_the_reason_and_a_retry_after_the_fix_succeeds(
    org_with_ledger: Organization,
) -> None:
    factor = EmissionFactor.objects.get(zone="FR", granularity="year", period_start__year=2025)
    table = EmissionFactor._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET relative_uncertainty = -1 WHERE id = %s", [factor.pk])
    report = _generate(org_with_ledger)
    assert report.status == "failed"
    assert "relative_uncertainty must be >= 0" in report.failure_reason
    assert not report.files.exists()
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET relative_uncertainty = 0.1 WHERE id = %s", [factor.pk])
    report_retry(report=report)
    retried = report_generate(report.pk)
    assert retried is not None and retried.status == "done" and retried.attempts == 2
    assert retried.failure_reason == ""


def test_a_broken_chain_fails_the_report_unless_accepted_and_is_then_stated(
    org_with_ledger: Organization,
) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE ledger_request SET work_units = 99 WHERE id = %s",
            [LedgerRequest.objects.earliest("seq").pk],
        )
    # The daily full verification finds it (a report's own pass checks what is new since the last one).
    from ledger.services import ledger_verify

    ledger_verify(full=True)
    refused = _generate(org_with_ledger)
    assert refused.status == "failed"
    assert (
        "report-test is broken" in refused.failure_reason and "accept_broken_chain" in refused.failure_reason
    )
    accepted = _generate(org_with_ledger, accept_broken_chain=True)
    assert accepted.status == "done"
    assert accepted.snapshot["ledger"]["intact"] is False
    assert "BROKEN" in _pdf_text(accepted)


def test_a_report_lists_only_the_chains_holding_the_organization_s_records_of_its_period(
    org_with_ledger: Organization,
) -> None:
    gpu = Device.objects.get(device_id=f"gpu-{org_with_ledger.slug}")
    n = next(_ids)
    march = int(datetime(2025, 3, 5, 9, tzinfo=UTC).timestamp() * 1e9)
    append_records(
        "report-march", one_request_records("r", n, org_with_ledger.pk, gpu.device_id, march, 1, "digits")
    )
    other = OrganizationFactory()
    append_records(
        "report-other", one_request_records("r", n + 1, other.pk, gpu.device_id, march, 1, "digits")
    )
    rollups_update()
    january = _generate(org_with_ledger)
    assert [c["chain_id"] for c in january.snapshot["ledger"]["chains"]] == ["report-test"]
    first_quarter = report_request(organization=org_with_ledger, start=date(2025, 1, 1), end=date(2025, 4, 1))
    done = report_generate(first_quarter.pk)
    assert done is not None and done.status == "done"
    assert [c["chain_id"] for c in done.snapshot["ledger"]["chains"]] == ["report-march", "report-test"]


def test_the_monthly_schedule_asks_once_for_last_months_report_of_each_organization_with_data(
    org_with_ledger: Organization,
) -> None:
    idle_org = OrganizationFactory()
    made = reports_monthly(today=date(2025, 2, 3))
    assert [(r.organization_id, r.period_start, r.period_end, r.kind) for r in made] == [
        (org_with_ledger.pk, JAN[0], JAN[1], "monthly")
    ]
    assert reports_monthly(today=date(2025, 2, 20)) == []
    assert not Report.objects.filter(organization=idle_org).exists()
    assert settings.CELERY_BEAT_SCHEDULE["reports-monthly"]["task"] == "reports.monthly"


def _client(org: Organization, scopes: str = "read,admin") -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=org, scopes=scopes).raw_key}")
    return client


def test_the_api_requests_a_report_shows_its_progress_and_serves_files_to_its_owner_only(
    org_with_ledger: Organization,
) -> None:
    client = _client(org_with_ledger)
    response = client.post("/api/v1/reports", {"start": "2025-01-01", "end": "2025-02-01"}, format="json")
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["status"], body["progress"]) == ("queued", 0)
    report_generate(body["id"])  # what the Celery task does
    detail = client.get(f"/api/v1/reports/{body['id']}").json()
    assert (detail["status"], detail["progress"]) == ("done", 100)
    assert {f["format"] for f in detail["files"]} == {"pdf", "csv", "json", "esrs-e1"}
    for file in detail["files"]:
        got = client.get(file["url"])
        assert got.status_code == 200
        assert hashlib.sha256(got.content).hexdigest() == file["sha256"]
        assert file["filename"] in got["Content-Disposition"]
    assert client.get(detail["files"][0]["url"])["Content-Type"] in (
        "text/csv; charset=utf-8",
        "application/json",
        "application/pdf",
    )
    other = _client(OrganizationFactory())
    assert other.get(f"/api/v1/reports/{body['id']}").status_code == 404
    assert other.get(f"/api/v1/reports/{body['id']}/files/pdf").status_code == 404
    assert other.get("/api/v1/reports").json()["results"] == []


def test_the_api_refuses_bad_periods_and_unknown_formats(org_with_ledger: Organization) -> None:
    client = _client(org_with_ledger)
    bad = client.post("/api/v1/reports", {"start": "2025-02-01", "end": "2025-01-01"}, format="json")
    assert bad.status_code == 400 and "before its end" in str(bad.json()["error"])
    assert client.post("/api/v1/reports", {"start": "soon"}, format="json").status_code == 400
    report = _generate(org_with_ledger)
    assert client.get(f"/api/v1/reports/{report.pk}/files/docx").status_code == 404
    assert client.post(f"/api/v1/reports/{report.pk}/retry").status_code == 409
    assert (
        _client(org_with_ledger, "read")
        .post("/api/v1/reports", {"start": "2025-01-01", "end": "2025-02-01"}, format="json")
        .status_code
        == 403
    )


def test_generate_report_command_writes_the_three_files(org_with_ledger: Organization, tmp_path) -> None:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command(
        "generate_report",
        "--org",
        org_with_ledger.slug,
        "--start",
        "2025-01-01",
        "--end",
        "2025-02-01",
        "--out",
        str(tmp_path),
        stdout=out,
    )
    names = sorted(p.suffix for p in tmp_path.iterdir())
    assert names == [".csv", ".csv", ".json", ".pdf"]  # the report's CSV and esrs-e1.csv
    assert "inputs sha256" in out.getvalue()


def test_no_ledger_record_is_changed_by_a_report(org_with_ledger: Organization) -> None:
    before = list(LedgerRequest.objects.order_by("pk").values_list("hash", flat=True))
    _generate(org_with_ledger)
    assert list(LedgerRequest.objects.order_by("pk").values_list("hash", flat=True)) == before
