from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.verify import verify_all


class Command(BaseCommand):
    help = "Verify every ledger hash chain; exit 0 when intact, otherwise name the first broken link."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--workers",
            type=int,
            default=None,
            help="processes to verify in (default LEDGER_VERIFY_WORKERS); chains and segments of one chain "
            "are checked side by side",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["workers"] is not None and opts["workers"] < 1:
            raise CommandError("--workers must be 1 or more")
        reports = verify_all(workers=opts["workers"])
        broken = [r for r in reports if r.broken is not None]
        for r in reports:
            state = "BROKEN" if r.broken is not None else "intact"
            self.stdout.write(f"chain {r.chain_id}: {r.records} records, head seq {r.head_seq}: {state}")
        if broken:
            raise CommandError("\n".join(str(r.broken) for r in broken))
        self.stdout.write(
            f"ledger intact: {len(reports)} chain(s), {sum(r.records for r in reports)} records"
        )
