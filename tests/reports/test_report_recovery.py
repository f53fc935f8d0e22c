"""Reports whose worker or broker message was lost are recovered; a broker that is down loses no report;
a recalculation never hides behind another run; the management command needs no broker."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone

from carbon import services as carbon
from carbon.rollups import rollups_update
from ledger.writer import append_records
from reports import tasks
from reports.models import Report
from reports.services import report_generate, report_recalculate, report_request, reports_recover
from tenancy.models import Device, Organization
from tenancy.services import ServiceError
from tests.factories import OrganizationFactory
from tests.support.ledger import one_request_records

# Not transactional: the on-commit hooks (report generation sent to the broker) never fire unless captured.
pytestmark = pytest.mark.django_db

JAN = (date(2025, 1, 1), date(2025, 2, 1))
FEB = (date(2025, 2, 1), date(2025, 3, 1))
MAR = (date(2025, 3, 1), date(2025, 4, 1))
APR = (date(2025, 4, 1), date(2025, 5, 1))
MAY = (date(2025, 5, 1), date(2025, 6, 1))


@pytest.fixture
def org() -> Organization:
    """An organization with one metered kWh in January 2025, rolled up."""
    carbon.load_shipped_factors()
    org = OrganizationFactory(name="Recovery Inc")
    site = carbon.site_create(name=f"fr-{org.slug}", zone="FR", pue="1.2", organization=org)
    device = Device.objects.create(
        device_id=f"gpu-{org.slug}", kind="gpu", method="nvml-counter", measured=True, site=site
    )
    t = int(datetime(2025, 1, 10, 9, tzinfo=UTC).timestamp()) * 1_000_000_000
    append_records(
        "recovery-test", one_request_records("rec", 1, org.pk, device.device_id, t, 3_600_000_000_000)
    )
    rollups_update()
    return org


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The report ids sent to the broker (a remote service: recorded, not sent)."""
    calls: list[int] = []
    monkeypatch.setattr(tasks.generate_report, "delay", calls.append)
    return calls


def _report(org: Organization, period: tuple[date, date], **state: Any) -> Report:
    report = report_request(organization=org, start=period[0], end=period[1])
    if state:
        Report.objects.filter(pk=report.pk).update(**state)
        report.refresh_from_db()
    return report


def _stale(seconds: float) -> datetime:
    return timezone.now() - timedelta(seconds=seconds + 60)


# -- 10. reports_recover ----------------------------------------------------------------------------


def test_a_report_whose_worker_was_lost_is_queued_again_sent_and_then_completed(
    org: Organization, sent: list[int]
) -> None:
    lost = _report(
        org,
        JAN,
        status=Report.Status.RUNNING,
        started_at=_stale(settings.REPORT_RUNNING_STALE_S),
        attempts=1,
        progress=40,
    )

    assert reports_recover(now=timezone.now()) == [lost.pk]

    lost.refresh_from_db()
    assert (lost.status, lost.progress) == (Report.Status.QUEUED, 0)
    assert sent == [lost.pk]
    done = report_generate(lost.pk)
    assert done is not None and done.status == Report.Status.DONE, done and done.failure_reason
    assert done.attempts == 2
    assert done.files.count() == 4  # pdf, csv, json, esrs-e1


def test_recovery_fails_a_report_out_of_attempts_resends_stale_queued_ones_and_leaves_fresh_ones(
    org: Organization, sent: list[int]
) -> None:
    running_stale = _stale(settings.REPORT_RUNNING_STALE_S)
    abandoned = _report(
        org,
        JAN,
        status=Report.Status.RUNNING,
        started_at=running_stale,
        attempts=settings.REPORT_MAX_ATTEMPTS,
    )
    lost = _report(org, FEB, status=Report.Status.RUNNING, started_at=running_stale, attempts=1)
    unsent = _report(org, MAR, created_at=_stale(settings.REPORT_QUEUED_STALE_S))
    fresh_queued = _report(org, APR)
    fresh_running = _report(
        org, MAY, status=Report.Status.RUNNING, started_at=timezone.now() - timedelta(seconds=5), attempts=1
    )
    now = timezone.now()

    assert reports_recover(now=now) == sorted([lost.pk, unsent.pk])

    assert sorted(sent) == sorted([lost.pk, unsent.pk])
    abandoned.refresh_from_db()
    assert abandoned.status == Report.Status.FAILED
    assert abandoned.failure_reason.startswith("abandoned")
    assert str(settings.REPORT_MAX_ATTEMPTS) in abandoned.failure_reason
    statuses = dict(Report.objects.values_list("pk", "status"))
    assert statuses == {
        abandoned.pk: Report.Status.FAILED,
        lost.pk: Report.Status.QUEUED,
        unsent.pk: Report.Status.QUEUED,
        fresh_queued.pk: Report.Status.QUEUED,
        fresh_running.pk: Report.Status.RUNNING,
    }

    # A second run changes no status and fails nothing more; re-sending a queued report is harmless.
    reports_recover(now=now)
    assert dict(Report.objects.values_list("pk", "status")) == statuses
    assert set(sent) == {lost.pk, unsent.pk}
    for pk in sent:  # every message the worker receives, duplicates included
        report_generate(pk)
    attempts = dict(Report.objects.values_list("pk", "attempts"))
    assert (attempts[lost.pk], attempts[unsent.pk]) == (2, 1)
    assert Report.objects.get(pk=lost.pk).status == Report.Status.DONE
    assert Report.objects.get(pk=unsent.pk).status == Report.Status.DONE
    assert Report.objects.get(pk=fresh_running.pk).status == Report.Status.RUNNING


def test_the_recovery_runs_on_the_beat_schedule() -> None:
    assert settings.CELERY_BEAT_SCHEDULE["reports-recover"]["task"] == "reports.recover"
    assert tasks.recover_reports.name == "reports.recover"


# -- 11. a broker that is down loses no report ---------------------------------------------------------


def test_a_report_requested_while_the_broker_is_down_stays_queued(
    org: Organization, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    attempts: list[int] = []

    def down(report_id: int) -> None:
        attempts.append(report_id)
        raise ConnectionError("broker unreachable")

    monkeypatch.setattr(tasks.generate_report, "delay", down)
    with django_capture_on_commit_callbacks(execute=True):
        report = report_request(organization=org, start=JAN[0], end=JAN[1])

    assert attempts == [report.pk]
    report.refresh_from_db()
    assert report.status == Report.Status.QUEUED
    # Once the message counts as lost, the recovery sends it again.
    monkeypatch.setattr(tasks.generate_report, "delay", attempts.append)
    later = timezone.now() + timedelta(seconds=settings.REPORT_QUEUED_STALE_S + 60)
    assert reports_recover(now=later) == [report.pk]
    assert attempts == [report.pk, report.pk]


# -- 12. a recalculation does not hide behind another run ------------------------------------------


def test_a_recalculation_while_another_run_of_the_period_is_queued_is_refused_naming_it(
    org: Organization,
) -> None:
    first = report_request(organization=org, start=JAN[0], end=JAN[1])
    done = report_generate(first.pk)
    assert done is not None and done.status == Report.Status.DONE
    queued = report_request(organization=org, start=JAN[0], end=JAN[1])
    assert queued.pk != first.pk and queued.status == Report.Status.QUEUED

    with pytest.raises(ServiceError, match=f"report {queued.pk} "):
        report_recalculate(report=done, reason="hourly factors imported")

    assert Report.objects.filter(organization=org).count() == 2
    assert not Report.objects.filter(replaces=done).exists()


# -- 13. the management command needs no broker ---------------------------------------------------------


def test_the_generate_report_command_sends_nothing_to_the_broker(
    org: Organization, sent: list[int], django_capture_on_commit_callbacks: Any, tmp_path
) -> None:
    out = StringIO()
    with django_capture_on_commit_callbacks(execute=True):
        call_command(
            "generate_report",
            "--org",
            org.slug,
            "--start",
            "2025-01-01",
            "--end",
            "2025-02-01",
            "--out",
            str(tmp_path),
            stdout=out,
        )
    assert sent == []
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".csv", ".csv", ".json", ".pdf"]
    report = Report.objects.get(organization=org)
    assert (report.status, report.attempts) == (Report.Status.DONE, 1)
    assert f"report {report.pk}: inputs sha256" in out.getvalue()


def test_a_long_report_whose_worker_keeps_reporting_progress_is_not_taken_from_it(
    org: Organization, sent: list[int]
) -> None:
    busy = _report(
        org,
        JAN,
        status=Report.Status.RUNNING,
        started_at=_stale(settings.REPORT_RUNNING_STALE_S * 3),
        heartbeat_at=timezone.now(),
        attempts=1,
    )
    assert reports_recover(now=timezone.now()) == []
    busy.refresh_from_db()
    assert busy.status == Report.Status.RUNNING and sent == []


def test_a_run_that_lost_its_claim_changes_nothing_of_the_run_that_took_over(
    org: Organization, sent: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from reports import services

    report = _report(org, JAN)
    real = services.build_snapshot

    def taken_over_midway(report_: Report, progress: Any) -> dict[str, Any]:
        # While this (first) run works, recovery hands the report to a second attempt, which finishes first.
        snapshot = real(report_, progress)
        Report.objects.filter(pk=report_.pk).update(
            attempts=2, status=Report.Status.FAILED, failure_reason="x"
        )
        return snapshot

    monkeypatch.setattr(services, "build_snapshot", taken_over_midway)
    result = report_generate(report.pk)
    assert result is not None
    assert (result.status, result.failure_reason, result.files.count()) == (Report.Status.FAILED, "x", 0)
