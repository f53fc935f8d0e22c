"""A report of a month whose raw ledger records were archived is still generated, from the rollups, with the same
figures as before, and its chains are still stated verified (issue 24)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from carbon import services as carbon
from carbon.rollups import rollups_update
from ledger.models import LedgerArchive, LedgerRequest
from ledger.services import ledger_verify
from ledger.writer import append_records
from reports.models import Report, ReportingProfile
from reports.services import report_generate, report_recalculate, report_request
from tenancy.models import Device, Organization
from tests.factories import OrganizationFactory
from tests.support.ledger import one_request_records

pytestmark = pytest.mark.django_db

JAN = (date(2025, 1, 1), date(2025, 2, 1))


@pytest.fixture
def org(settings: Any, tmp_path: Path) -> Organization:
    settings.LEDGER_ARCHIVE_DIR = tmp_path / "archive"
    carbon.load_shipped_factors()
    org = OrganizationFactory(name="Archived Inference")
    ReportingProfile.objects.create(
        organization=org,
        responsible_person="Ada Lovelace",
        base_year=2024,
        description="Old months archived.",
    )
    site = carbon.site_create(name=f"fr-{org.slug}", zone="FR", pue="1.2", organization=org)
    gpu = Device.objects.create(
        device_id=f"gpu-{org.slug}",
        kind="gpu",
        method="nvml-counter",
        measured=True,
        relative_uncertainty=0.05,
        site=site,
    )
    for n, at in enumerate(
        [
            datetime(2025, 1, 10, 9, tzinfo=UTC),
            datetime(2025, 1, 20, 15, tzinfo=UTC),
            datetime(2025, 3, 5, tzinfo=UTC),
        ]
    ):
        t = int(at.timestamp() * 1e9)
        append_records(
            "archive-report", one_request_records("a", n, org.pk, gpu.device_id, t, 3_600_000_000_000)
        )
    rollups_update()
    ledger_verify()
    return org


def _generate(report: Report) -> Report:
    done = report_generate(report.pk)
    assert done is not None and done.status == "done", done and done.failure_reason
    return done


def test_a_report_of_an_archived_month_is_generated_from_the_rollups_with_the_same_figures(
    org: Organization,
) -> None:
    before = _generate(report_request(organization=org, start=JAN[0], end=JAN[1]))

    call_command("ledger_archive", "--before", "2025-02", stdout=StringIO())
    assert LedgerArchive.objects.get().records == 6  # January's two requests, three records each
    assert list(LedgerRequest.objects.values_list("request_id", flat=True)) == ["a.r2"]  # March's only

    after = _generate(report_recalculate(report=before, reason="regenerated after archiving"))

    assert after.pk != before.pk and after.snapshot is not None and before.snapshot is not None
    assert after.snapshot["results"] == before.snapshot["results"]
    assert after.snapshot["results"]["requests"] == 2
    [chain] = after.snapshot["ledger"]["chains"]
    assert chain["intact"] is True and after.snapshot["ledger"]["intact"] is True
    # The daily full run after archiving starts at the checkpoint, and the report names it as the last full one.
    (full,) = ledger_verify(full=True)
    assert full.from_seq == 6 and full.intact
    latest = _generate(report_recalculate(report=after, reason="after a full verification"))
    assert latest.snapshot is not None
    assert latest.snapshot["ledger"]["chains"][0]["last_full_verification_at"] == full.finished_at.isoformat()
