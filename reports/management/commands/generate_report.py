from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from carbon import co2e
from reports.models import Report
from reports.services import report_request
from reports.tasks import generate_report
from tenancy import selectors
from tenancy.services import ServiceError


def _day(raw: str, name: str) -> date:
    try:
        day = date.fromisoformat(raw)
    except ValueError:
        raise CommandError(f"--{name} must be a date YYYY-MM-DD, got {raw!r}") from None
    problem = co2e.year_problem(day, f"--{name}")  # the years every stored date keeps to
    if problem:
        raise CommandError(problem)
    return day


class Command(BaseCommand):
    help = (
        "Generate an organization's GHG report for [start, end) and write its PDF, CSV and JSON to --out. "
        "The report is queued like any other and its Celery task is run here, so no worker is needed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--org", required=True, help="organization slug")
        parser.add_argument("--start", required=True, help="first day, YYYY-MM-DD")
        parser.add_argument("--end", required=True, help="day after the last, YYYY-MM-DD (exclusive)")
        parser.add_argument("--out", required=True, type=Path, help="folder for the three files")
        parser.add_argument("--accept-broken-chain", action="store_true")

    def handle(self, *args: Any, **opts: Any) -> None:
        org = selectors.organization_by_slug(opts["org"])
        if org is None:
            raise CommandError(f"no organization with the slug '{opts['org']}'")
        start, end = _day(opts["start"], "start"), _day(opts["end"], "end")
        out: Path = opts["out"]
        try:  # before the report runs: a folder that cannot be written would waste the run
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CommandError(f"--out {out}: {exc.strerror or exc}") from None
        try:
            report = report_request(
                organization=org,
                start=start,
                end=end,
                requested_by="manage.py generate_report",
                accept_broken_chain=opts["accept_broken_chain"],
                queue=False,  # generated here: no broker or worker needed
            )
        except ServiceError as exc:
            raise CommandError(str(exc)) from None
        generate_report.apply(args=[report.pk])
        report.refresh_from_db()
        if report.status != Report.Status.DONE:
            raise CommandError(
                f"report {report.pk} {report.status}: {report.failure_reason or 'still running'}"
            )
        for file in report.files.order_by("format"):
            path = out / file.filename
            try:
                path.write_bytes(bytes(file.content))
            except OSError as exc:
                raise CommandError(f"cannot write {path}: {exc.strerror or exc}") from None
            self.stdout.write(f"{path}  sha256 {file.sha256}")
        self.stdout.write(f"report {report.pk}: inputs sha256 {report.inputs_sha256}")
