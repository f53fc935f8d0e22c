from __future__ import annotations

from celery import shared_task

from reports.services import report_generate, reports_monthly, reports_recover


@shared_task(name="reports.generate")
def generate_report(report_id: int) -> str | None:
    """Generate one queued report (a second run finds it no longer queued and does nothing)."""
    report = report_generate(report_id)
    return None if report is None else str(report.status)


@shared_task(name="reports.monthly")
def monthly_reports() -> list[int]:
    """Scheduled on the first of the month: last month's report for each organization with energy in it."""
    return [report.pk for report in reports_monthly()]


@shared_task(name="reports.recover")
def recover_reports() -> list[int]:
    """Every five minutes: reports whose worker was lost are queued again, lost queue messages re-sent."""
    return reports_recover()
