from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from carbon.rollups import rollups_update
from carbon.services import load_shipped_factors
from demo.synthetic_ledger import generate_ledger
from tenancy import selectors
from tenancy.services import ServiceError


class Command(BaseCommand):
    help = (
        "Write a realistic synthetic ledger (marked synthetic in the data) for demos and benchmarks: "
        "requests, batches, metering intervals and idle lines, hash-chained like live records."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--org", required=True, help="organization slug")
        parser.add_argument("--requests", type=int, default=100_000)
        parser.add_argument("--days", type=float, default=30)
        parser.add_argument("--seed", type=int, default=1)
        parser.add_argument("--no-rollup", action="store_true", help="do not update the rollups afterwards")

    def handle(self, *args: Any, **opts: Any) -> None:
        org = selectors.organization_by_slug(opts["org"])
        if org is None:
            raise CommandError(f"no organization with the slug '{opts['org']}'")
        load_shipped_factors()
        try:
            result = generate_ledger(
                organization=org, requests=opts["requests"], days=opts["days"], seed=opts["seed"]
            )
        except ServiceError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"wrote {result.requests} synthetic requests ({result.records} ledger records, chain "
            f"{result.chain_id}) from {result.start.isoformat()} to {result.end.isoformat()} "
            f"in {result.seconds:.1f} s"
        )
        if not opts["no_rollup"]:
            run = rollups_update()
            self.stdout.write(f"rollups updated in {run.seconds:.1f} s ({run.rows_created} rows created)")
