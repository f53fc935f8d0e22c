"""Writes of the reports domain: request, generate (the Celery task's body), retry, recalculate, monthly."""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from carbon import co2e
from carbon.models import HourlyRollup
from inference import limits
from reports.esrs import render_esrs_csv
from reports.models import Report, ReportFile, ReportingProfile
from reports.pdf import html_to_pdf
from reports.render import render_csv, render_html, render_json
from reports.snapshot import ReportFailure, ReportProgress, build_snapshot
from tenancy.models import Organization
from tenancy.queue import task_named
from tenancy.services import ServiceError

log = logging.getLogger(__name__)

ACTIVE = (Report.Status.QUEUED, Report.Status.RUNNING)


def _send(report_id: int) -> None:
    try:
        task_named("reports.generate").delay(report_id)
    except Exception:  # the broker is down: the report stays queued and reports_recover sends it again
        log.exception("report %s could not be sent to the broker; it will be sent again", report_id)


def _queue(report: Report) -> None:
    report_id = report.pk
    transaction.on_commit(lambda: _send(report_id))


def _active(organization: Organization, start: date, end: date) -> QuerySet[Report]:
    """The queued or running report of an organization and period (at most one: a partial unique index)."""
    return Report.objects.filter(
        organization=organization, period_start=start, period_end=end, status__in=ACTIVE
    )


def _claimed(report_id: int, attempt: int) -> QuerySet[Report]:
    """The report while run ``attempt`` still holds it: every write of a run goes through this."""
    return Report.objects.filter(pk=report_id, status=Report.Status.RUNNING, attempts=attempt)


def report_request(
    *,
    organization: Organization,
    start: date,
    end: date,
    requested_by: str = "",
    accept_broken_chain: bool = False,
    kind: str = "on_demand",
    replaces: Report | None = None,
    replacement_reason: str = "",
    queue: bool = True,
) -> Report:
    """Ask for a report of [start, end). While one for the same organization and period is queued or
    running, that one is returned instead of starting a second run. ``queue=False`` leaves it queued
    without sending it to the broker (the caller runs :func:`report_generate` itself)."""
    if start >= end:
        raise ServiceError(f"the period start {start} must be before its end {end}")
    if start > timezone.now().date():
        raise ServiceError(f"the period starts in the future ({start})")
    if end - start > timedelta(days=3660):
        raise ServiceError("a report covers at most ten years")
    active = _active(organization, start, end)
    for _ in range(3):
        running = active.first()
        if running is not None:
            return running
        try:
            with transaction.atomic():
                report = Report.objects.create(
                    organization=organization,
                    period_start=start,
                    period_end=end,
                    requested_by=requested_by,
                    accept_broken_chain=accept_broken_chain,
                    kind=kind,
                    replaces=replaces,
                    replacement_reason=replacement_reason,
                )
                if queue:
                    _queue(report)
            return report
        except IntegrityError:
            continue  # another request won the race for this period (and may even be done by now)
    raise ServiceError("reports for this period are being requested concurrently; try again")


def report_recalculate(*, report: Report, reason: str, requested_by: str = "") -> Report:
    """A new version of a finished report, naming the one it replaces and why; the old one is unchanged."""
    if not reason.strip():
        raise ServiceError("a recalculation needs a reason")
    if report.status != Report.Status.DONE:
        raise ServiceError(
            f"report {report.pk} is {report.status}; only a finished report can be recalculated"
        )
    busy = _active(report.organization, report.period_start, report.period_end).first()
    if busy is not None:
        # Returning that run would drop the reason and the link to the report it replaces.
        raise ServiceError(
            f"report {busy.pk} for the same period is {busy.status}; recalculate once it has finished"
        )
    return report_request(
        organization=report.organization,
        start=report.period_start,
        end=report.period_end,
        requested_by=requested_by,
        accept_broken_chain=report.accept_broken_chain,
        kind=report.kind,
        replaces=report,
        replacement_reason=reason.strip(),
    )


def report_retry(*, report: Report) -> Report:
    """Run a failed report again (after the cause was fixed)."""
    if report.status != Report.Status.FAILED:
        raise ServiceError(f"report {report.pk} is {report.status}; only a failed report can be retried")
    try:
        with transaction.atomic():
            Report.objects.filter(pk=report.pk, status=Report.Status.FAILED).update(
                status=Report.Status.QUEUED, progress=0, progress_message="queued again", failure_reason=""
            )
            _queue(report)
    except IntegrityError:
        raise ServiceError("another report for the same period is already queued or running") from None
    report.refresh_from_db()
    return report


class _LostClaim(Exception):
    """The report was queued again (its worker looked lost) while this run went on: this run stops."""


def _progress(report_id: int, attempt: int) -> ReportProgress:
    def update(percent: int, message: str) -> None:
        # The heartbeat tells reports_recover this run is alive; only this run's claim may move it.
        if not _claimed(report_id, attempt).update(
            progress=percent, progress_message=message[:200], heartbeat_at=timezone.now()
        ):
            raise _LostClaim(f"report {report_id} is no longer claimed by attempt {attempt}")

    return update


def report_generate(report_id: int) -> Report | None:
    """Generate a queued report: freeze the snapshot, render PDF, CSV and JSON, store them with their
    SHA-256. Safe to run twice: only a queued report is claimed, so a second run finds nothing to do."""
    claimed = Report.objects.filter(pk=report_id, status=Report.Status.QUEUED).update(
        status=Report.Status.RUNNING,
        started_at=timezone.now(),
        heartbeat_at=timezone.now(),
        attempts=F("attempts") + 1,
        progress=5,
        progress_message="started",
    )
    report = Report.objects.select_related("organization").filter(pk=report_id).first()
    if report is None or not claimed:
        return report
    attempt = report.attempts
    progress = _progress(report.pk, attempt)
    try:
        snapshot = build_snapshot(report, progress)
        progress(70, "rendering CSV and JSON")
        files = {
            "csv": render_csv(snapshot),
            "json": render_json(snapshot),
            "esrs-e1": render_esrs_csv(snapshot),
        }
        progress(80, "rendering the PDF")
        files["pdf"] = html_to_pdf(render_html(snapshot))
    except _LostClaim:
        log.warning("report %s: attempt %s lost its claim; its results are dropped", report.pk, attempt)
        report.refresh_from_db()
        return report
    except ReportFailure as exc:
        return _fail(report, str(exc), attempt)
    except Exception as exc:
        log.exception("report %s failed", report.pk)
        return _fail(report, f"unexpected error: {type(exc).__name__}: {exc}", attempt)
    stem = f"ghg-report-{report.organization.slug}-{report.period_start}-{report.period_end}-r{report.pk}"
    with transaction.atomic():
        # Only while this run still holds the claim: a run queued again meanwhile owns the report now.
        if not _claimed(report.pk, attempt).select_for_update().exists():
            log.warning("report %s: attempt %s lost its claim; its files are dropped", report.pk, attempt)
            report.refresh_from_db()
            return report
        ReportFile.objects.filter(report=report).delete()
        for fmt, content in files.items():
            ReportFile.objects.create(
                report=report,
                format=fmt,
                filename=f"{stem}-esrs-e1.csv" if fmt == "esrs-e1" else f"{stem}.{fmt}",
                sha256=hashlib.sha256(content).hexdigest(),
                size=len(content),
                content=content,
            )
        _claimed(report.pk, attempt).update(
            status=Report.Status.DONE,
            snapshot=snapshot,
            inputs_sha256=snapshot["inputs_sha256"],
            code_version=snapshot["code_version"],
            progress=100,
            progress_message="done",
            finished_at=timezone.now(),
        )
    report.refresh_from_db()
    return report


def _fail(report: Report, reason: str, attempt: int) -> Report:
    _claimed(report.pk, attempt).update(
        status=Report.Status.FAILED,
        failure_reason=reason,
        progress_message="failed",
        finished_at=timezone.now(),
    )
    report.refresh_from_db()
    return report


def reports_recover(*, now: datetime | None = None) -> list[int]:
    """Reports a lost worker left running are queued again (or failed after ``REPORT_MAX_ATTEMPTS`` runs);
    queued reports whose broker message was lost are sent again. Safe to run any time: generation claims a
    report only while it is queued. Returns the ids queued again or re-sent."""
    at = now or timezone.now()
    running_before = at - timedelta(seconds=settings.REPORT_RUNNING_STALE_S)
    queued_before = at - timedelta(seconds=settings.REPORT_QUEUED_STALE_S)
    sent: list[int] = []
    silent = Q(heartbeat_at__lt=running_before) | Q(heartbeat_at__isnull=True, started_at__lt=running_before)
    for report in Report.objects.filter(silent, status=Report.Status.RUNNING):
        if report.attempts >= settings.REPORT_MAX_ATTEMPTS:
            _claimed(report.pk, report.attempts).update(
                status=Report.Status.FAILED,
                failure_reason=f"abandoned: no worker finished it in {report.attempts} attempts "
                f"of {settings.REPORT_RUNNING_STALE_S:.0f} s each",
                progress_message="failed",
                finished_at=at,
            )
            continue
        if _claimed(report.pk, report.attempts).update(
            status=Report.Status.QUEUED, progress=0, progress_message="queued again: its worker was lost"
        ):
            sent.append(report.pk)
    stale_queued = Report.objects.filter(status=Report.Status.QUEUED).filter(
        Q(started_at__isnull=True, created_at__lt=queued_before) | Q(started_at__lt=queued_before)
    )
    sent.extend(pk for pk in stale_queued.values_list("pk", flat=True) if pk not in sent)
    for pk in sent:
        _send(pk)
    return sorted(sent)


def reports_monthly(*, today: date | None = None) -> list[Report]:
    """Request last month's report for every organization with rolled-up energy in it (once per month)."""
    day = today or timezone.now().date()
    end = day.replace(day=1)
    start = (end - timedelta(days=1)).replace(day=1)
    start_dt = datetime(start.year, start.month, 1, tzinfo=UTC)
    end_dt = datetime(end.year, end.month, 1, tzinfo=UTC)
    org_ids = set(
        HourlyRollup.objects.filter(hour__gte=start_dt, hour__lt=end_dt, organization__isnull=False)
        .values_list("organization_id", flat=True)
        .distinct()
    )
    made = []
    for org in Organization.objects.filter(pk__in=org_ids).order_by("pk"):
        if Report.objects.filter(
            organization=org, period_start=start, period_end=end, kind="monthly"
        ).exists():
            continue
        made.append(
            report_request(organization=org, start=start, end=end, kind="monthly", requested_by="schedule")
        )
    return made


def net_revenue_set(
    *,
    organization: Organization,
    amount: Decimal | str | None,
    currency: str = "EUR",
    year: int | None = None,
) -> ReportingProfile:
    """Record the organization's net revenue of financial year ``year`` (in ``currency``, an ISO 4217 code),
    the denominator of the ESRS E1 intensities (E1-5 §40, E1-6 §53); ``amount=None`` clears it and the
    intensities are no longer reported."""
    profile, _ = ReportingProfile.objects.get_or_create(organization=organization)
    if amount is None:
        profile.net_revenue, profile.net_revenue_year = None, None
        profile.save(update_fields=["net_revenue", "net_revenue_year", "updated_at"])
        return profile
    try:
        value = Decimal(str(amount).strip())
    except (InvalidOperation, ValueError):
        raise ServiceError(f"net revenue must be a number, got {amount!r}") from None
    if not value.is_finite() or value <= 0 or value >= Decimal(10) ** 18:
        raise ServiceError(f"net revenue must be above 0 and below 10^18, got {amount!r}")
    if value != value.quantize(Decimal("0.01")):
        raise ServiceError(f"net revenue takes at most 2 decimal places, got {amount!r}")
    if not (len(currency) == 3 and currency.isascii() and currency.isalpha() and currency.isupper()):
        raise ServiceError(f"currency must be an ISO 4217 code such as EUR, got {currency!r}")
    if year is None or isinstance(year, bool) or not co2e.FIRST_YEAR <= int(year) <= co2e.LAST_YEAR:
        raise ServiceError(f"year must be from {co2e.FIRST_YEAR} to {co2e.LAST_YEAR}, got {year!r}")
    profile.net_revenue, profile.net_revenue_currency, profile.net_revenue_year = value, currency, int(year)
    profile.save(update_fields=["net_revenue", "net_revenue_currency", "net_revenue_year", "updated_at"])
    return profile


def responsible_person_set(*, organization: Organization, responsible_person: str) -> ReportingProfile:
    """Name the person responsible for the organization's GHG reports (ISO 14064-1, 9.3.1 b); an empty name
    clears it, and the reports state the departure. The limit is the column's (inference/limits.py)."""
    name = " ".join(str(responsible_person).split())
    if len(name) > limits.RESPONSIBLE_PERSON_MAX_LENGTH:
        raise ServiceError(
            f"the responsible person takes at most {limits.RESPONSIBLE_PERSON_MAX_LENGTH} characters, "
            f"got {len(name)}"
        )
    if not name.isprintable():
        raise ServiceError("the responsible person may not hold control characters")
    profile, _ = ReportingProfile.objects.get_or_create(organization=organization)
    profile.responsible_person = name
    profile.save(update_fields=["responsible_person", "updated_at"])
    return profile
