from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from carbon.certificate_csv import MAX_BYTES
from carbon.models import ContractualInstrument
from carbon.services import CertificateImportError, instrument_certificates_import
from tenancy import selectors
from tenancy.services import ServiceError


class Command(BaseCommand):
    help = (
        "Import granular (hourly) certificates of an instrument from a CSV "
        "(certificate_id,production_start,production_end,energy_wh[,energy_source]), all or nothing: the "
        "instrument is then matched hour by hour. Every rejected row is printed with its line and reason."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)
        parser.add_argument("--org", required=True, help="organization slug")
        parser.add_argument(
            "--instrument", required=True, help="the instrument_id the certificates belong to"
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        path: Path = opts["file"]
        org = selectors.organization_by_slug(opts["org"])
        if org is None:
            raise CommandError(f"no organization with the slug '{opts['org']}'")
        instrument = ContractualInstrument.objects.filter(
            organization=org, instrument_id=opts["instrument"]
        ).first()
        if instrument is None:
            raise CommandError(f"no instrument '{opts['instrument']}' in {org.slug}: record it first")
        try:
            size = path.stat().st_size
            if size > MAX_BYTES:  # refused before it is read
                raise CommandError(f"{path.name} is {size} bytes; at most {MAX_BYTES} bytes per import")
            data = path.read_bytes()
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        try:
            count = instrument_certificates_import(
                instrument=instrument, data=data, created_by="manage.py import_certificates"
            )
        except CertificateImportError as exc:
            for error in exc.errors:
                self.stderr.write(f"{path.name}:{error.line}: {error.reason}")
            listed = f", the first {len(exc.errors)} listed" if len(exc.errors) < exc.count else ""
            raise CommandError(
                f"{path.name} rejected: {exc.count} problem(s){listed}, nothing imported"
            ) from None
        except ServiceError as exc:
            raise CommandError(str(exc)) from None
        instrument.refresh_from_db()
        self.stdout.write(
            f"imported {count} certificate(s) into {instrument.instrument_id}: matched hour by hour, "
            f"{instrument.mwh} MWh in all"
        )
