from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from carbon.models import FactorImport
from carbon.services import factor_import_csv, import_errors
from tenancy import selectors
from tenancy.services import ServiceError


class Command(BaseCommand):
    help = (
        "Import a CSV of grid carbon intensities as a new factor version, all or nothing: a plain "
        "zone,datetime,g_co2e_per_kwh file, an Electricity Maps hourly export, or the annual layout of the "
        "shipped figures. Every rejected row is printed with its line number and reason."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)
        parser.add_argument("--org", default="", help="owner organization slug (default: shared by all)")
        parser.add_argument("--source", default=None, help="who published the figures")
        parser.add_argument("--licence", default=None)
        parser.add_argument("--url", default=None)
        parser.add_argument("--allow-new-zones", action="store_true", help="accept zones not known yet")

    def handle(self, *args: Any, **opts: Any) -> None:
        path: Path = opts["file"]
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        org = None
        if opts["org"]:
            org = selectors.organization_by_slug(opts["org"])
            if org is None:
                raise CommandError(f"no organization with the slug '{opts['org']}'")
        try:
            record = factor_import_csv(
                data=data,
                name=path.name,
                organization=org,
                created_by="manage.py import_intensity",
                source=opts["source"],
                licence=opts["licence"],
                url=opts["url"],
                allow_new_zones=opts["allow_new_zones"],
            )
        except ServiceError as exc:
            raise CommandError(str(exc)) from None
        if record.status != FactorImport.Status.ACCEPTED:
            shown, count = import_errors(record)
            for error in shown:
                self.stderr.write(f"{path.name}:{error['line']}: {error['reason']}")
            listed = f", the first {len(shown)} listed" if len(shown) < count else ""
            raise CommandError(
                f"{path.name} rejected: {count} bad row(s){listed}, nothing imported (import {record.pk})"
            )
        self.stdout.write(
            f"imported {record.row_count} factor(s) from {path.name} ({record.layout}) as version {record.pk}"
        )
