from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from carbon.services import load_shipped_factors
from ledger.partitions import ensure_partitions
from tenancy.locks import database_lock


class Command(BaseCommand):
    help = (
        "Prepare the database: apply the migrations, load the shipped emission factors and, with --demo, the "
        "demo organization, data, user and key (bootstrap_demo). Safe to run from several replicas at once: "
        "each holds the database's set-up lock in turn, and the later ones find the work done."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--demo", action="store_true", help="also run bootstrap_demo (the one-box demo)")

    def handle(self, *args: Any, **opts: Any) -> None:
        with database_lock("setup", on_wait=lambda line: self.stderr.write(line)):
            call_command("migrate", interactive=False, verbosity=opts["verbosity"], stdout=self.stdout)
            for name in ensure_partitions(settings.LEDGER_PARTITION_MONTHS_AHEAD):
                self.stdout.write(f"created the ledger partition {name}")
            for record in load_shipped_factors():
                self.stdout.write(f"loaded {record.row_count} emission factor(s) from {record.name}")
            if opts["demo"]:
                call_command("bootstrap_demo", stdout=self.stdout, stderr=self.stderr)
        self.stdout.write("set-up done")
