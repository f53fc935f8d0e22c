from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.archive import ArchiveError, ledger_archive, parse_period, period_before


class Command(BaseCommand):
    help = (
        "Move the ledger records of the months before --before (default: LEDGER_RETENTION_MONTHS) into archive "
        "files in LEDGER_ARCHIVE_DIR, with their hashes, then delete them; only what was verified and rolled up."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--before", help="YYYY-MM: archive the records of the months before this one")
        parser.add_argument(
            "--dry-run", action="store_true", help="say what would be archived; change nothing"
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            if opts["before"]:
                before = parse_period(opts["before"])
            elif settings.LEDGER_RETENTION_MONTHS:
                before = period_before(settings.LEDGER_RETENTION_MONTHS)
            else:
                raise CommandError(
                    "name the month with --before YYYY-MM (LEDGER_RETENTION_MONTHS is 0: keep all)"
                )
            run = ledger_archive(before, dry_run=opts["dry_run"])
        except ArchiveError as exc:
            raise CommandError(str(exc)) from None
        cutoff = f"{before // 100}-{before % 100:02d}"
        for o in run.outcomes:
            if o.to_seq > o.from_seq:
                verb = "would archive" if opts["dry_run"] else "archived"
                where = f" to {o.path}, {o.deleted} row(s) deleted" if o.path else ""
                note = f" ({o.note})" if o.note else ""
                self.stdout.write(
                    f"chain {o.chain_id}: {verb} seq {o.from_seq + 1}..{o.to_seq} ({o.records} records){where}{note}"
                )
            else:
                self.stdout.write(f"chain {o.chain_id}: nothing to archive before {cutoff} ({o.note})")
        if run.dropped_partitions:
            self.stdout.write(f"dropped the partitions {', '.join(run.dropped_partitions)} (wholly archived)")
