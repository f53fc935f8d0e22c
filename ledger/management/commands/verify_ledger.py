from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger.verify import verify_all


class Command(BaseCommand):
    help = "Verify every ledger hash chain; exit 0 when intact, otherwise name the first broken link."

    def handle(self, *args: Any, **opts: Any) -> None:
        reports = verify_all()
        broken = [r for r in reports if r.broken is not None]
        for r in reports:
            state = "BROKEN" if r.broken is not None else "intact"
            self.stdout.write(f"chain {r.chain_id}: {r.records} records, head seq {r.head_seq}: {state}")
        if broken:
            raise CommandError("\n".join(str(r.broken) for r in broken))
        self.stdout.write(
            f"ledger intact: {len(reports)} chain(s), {sum(r.records for r in reports)} records"
        )
