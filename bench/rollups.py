"""Hourly rollups: build time for N request records, and a month's dashboard query from the rollups.

Writes a synthetic ledger with ``load_demo_ledger``'s generator (requests, batches, per-minute intervals and
idle lines, hash-chained) into a fresh database, then times ``rollups_rebuild()`` (every record read, every
hour's CO2e computed both ways), checks the rollup totals against the raw totals, and times the month query
the dashboard runs (totals plus a daily series for one organization) 50 times.

Targets (issue 4): 10 million request records rolled up in at most 60 s; the month query in at most 100 ms.

Usage:
  .venv/bin/python bench/rollups.py --db postgres --requests 10000000 --days 30
  .venv/bin/python bench/rollups.py --db sqlite --requests 1000000 --days 30
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import RESULTS_DIR, drop_database, setup_django, use_database, utc_stamp, write_json  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="postgres")
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="cl-rollups-"))
    url = use_database(args.db, workdir)
    setup_django()
    from django.core.management import call_command
    from django.db import connection
    from django.db.models import Sum

    from carbon.models import HourlyRollup
    from carbon.rollups import rollups_rebuild
    from carbon.selectors import rollup_series, rollup_totals
    from carbon.services import load_shipped_factors
    from demo.synthetic_ledger import generate_ledger
    from ledger.models import LedgerBatchEnergy, LedgerIdle, LedgerRequest, LedgerRequestEnergy
    from tenancy.services import organization_create

    try:
        call_command("migrate", verbosity=0)
        load_shipped_factors()
        org = organization_create(slug="bench", name="Benchmark")
        end = datetime(2026, 11, 1, tzinfo=UTC)
        generated = generate_ledger(organization=org, requests=args.requests, days=args.days, end=end, seed=7)
        print(
            f"wrote {generated.requests} requests ({generated.records} records) in {generated.seconds:.0f} s",
            flush=True,
        )
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE")

        t0 = time.perf_counter()
        run = rollups_rebuild()
        build_s = time.perf_counter() - t0
        print(f"rollups rebuilt in {build_s:.1f} s ({run.rows_created} rows)", flush=True)

        raw_requests = LedgerRequest.objects.count()
        raw_uj = sum(
            model.objects.aggregate(s=Sum("energy_uj"))["s"] or 0
            for model in (LedgerRequestEnergy, LedgerBatchEnergy, LedgerIdle)
        )
        rolled = HourlyRollup.objects.aggregate(r=Sum("requests"), e=Sum("energy_uj"))
        totals_equal = rolled["r"] == raw_requests and rolled["e"] == raw_uj

        month_start = end - timedelta(days=30)
        timings_ms = []
        for _ in range(50):
            t = time.perf_counter()
            rollup_totals(org.pk, month_start, end)
            rollup_series(org.pk, month_start, end, "day")
            timings_ms.append((time.perf_counter() - t) * 1000)
        timings_ms.sort()
        result = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "db": args.db,
            "requests": raw_requests,
            "ledger_records": generated.records,
            "generate_s": round(generated.seconds, 1),
            "rollup_build_s": round(build_s, 2),
            "rollup_rows": run.rows_created,
            "totals_equal_raw": totals_equal,
            "month_query_ms": {
                "p50": round(statistics.median(timings_ms), 2),
                "p95": round(timings_ms[int(len(timings_ms) * 0.95) - 1], 2),
                "max": round(timings_ms[-1], 2),
            },
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "targets": {"rollup_build_s": 60, "month_query_ms": 100},
            "cpus": os.cpu_count(),
        }
        print(json.dumps(result, indent=2))
        write_json(RESULTS_DIR / f"rollups-{args.db}-{utc_stamp()}.json", result)
    finally:
        connection.close()
        if not args.keep:
            drop_database(url)


if __name__ == "__main__":
    main()
