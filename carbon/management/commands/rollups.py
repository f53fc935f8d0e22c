from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from carbon.rollups import RebuildRefused, recompute_carbon, rollups_rebuild, rollups_update


class Command(BaseCommand):
    help = "Update the hourly rollups from new ledger records; --rebuild builds them again from scratch."

    def add_arguments(self, parser: CommandParser) -> None:
        what = parser.add_mutually_exclusive_group()
        what.add_argument("--rebuild", action="store_true", help="drop the rollups and rebuild from raw")
        what.add_argument("--carbon", action="store_true", help="only recompute CO2e (factors changed)")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["carbon"]:
            self.stdout.write(f"recomputed the CO2e of {recompute_carbon()} rollup row(s)")
            return
        try:
            run = rollups_rebuild() if opts["rebuild"] else rollups_update()
        except RebuildRefused as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"rollups {'rebuilt' if opts['rebuild'] else 'updated'} in {run.seconds:.2f} s: "
            f"{run.rows_created} row(s) created, {run.rows_updated} updated"
        )
