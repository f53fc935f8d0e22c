"""Reads of the reports domain, always scoped to one organization."""

from __future__ import annotations

from reports.models import Report, ReportFile


def reports_of(organization_id: int, limit: int = 200) -> list[Report]:
    return list(Report.objects.filter(organization_id=organization_id).defer("snapshot")[:limit])


def report_of(organization_id: int, pk: int) -> Report | None:
    return Report.objects.filter(organization_id=organization_id, pk=pk).first()


def files_of(report: Report) -> list[ReportFile]:
    return list(report.files.defer("content").order_by("format"))


def file_of(report: Report, fmt: str) -> ReportFile | None:
    return report.files.filter(format=fmt).first()
