"""A one-month GHG report for an organization with N request records: wall time and peak memory.

Writes a month of synthetic ledger (``load_demo_ledger``'s generator) into a fresh database, brings the
rollups and the ledger verification up to date as their scheduled tasks would (timed separately), then runs
``manage.py generate_report`` for that month in a child process and measures its wall time and peak RSS
(``wait4``): snapshot (incremental chain verification, both Scope 2 methods, breakdowns), CSV, JSON and PDF.

Target (issue 5): 10 million request records, at most 30 s and 1 GB peak memory.

Usage:
  .venv/bin/python bench/report.py --db postgres --requests 10000000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
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
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the database (for bench/dashboard.py)")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="cl-report-"))
    url = use_database(args.db, workdir)
    setup_django()
    from django.core.management import call_command
    from django.db import connection

    from carbon.rollups import rollups_update
    from carbon.services import load_shipped_factors
    from demo.synthetic_ledger import generate_ledger
    from ledger.services import ledger_verify
    from tenancy.services import organization_create

    try:
        call_command("migrate", verbosity=0)
        load_shipped_factors()
        org = organization_create(slug="bench", name="Benchmark Inference Ltd")
        end = datetime(2026, 11, 1, tzinfo=UTC)
        generated = generate_ledger(organization=org, requests=args.requests, days=31, end=end, seed=11)
        print(
            f"wrote {generated.requests} requests ({generated.records} records) in {generated.seconds:.0f} s"
        )
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE")
        t = time.perf_counter()
        rollups_update()
        rollup_s = time.perf_counter() - t
        t = time.perf_counter()
        ledger_verify(full=True)
        verify_s = time.perf_counter() - t
        print(f"rollups {rollup_s:.1f} s, full ledger verification {verify_s:.1f} s (scheduled tasks)")
        connection.close()

        runs = []
        for run in range(args.runs):
            out = workdir / f"out{run}"
            started = time.perf_counter()
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "manage.py",
                    "generate_report",
                    "--org",
                    "bench",
                    "--start",
                    "2026-10-01",
                    "--end",
                    "2026-11-01",
                    "--out",
                    str(out),
                ],
                cwd=ROOT,
                env={**os.environ, "DATABASE_URL": url, "LOG_LEVEL": "WARNING"},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            _, status, usage = os.wait4(proc.pid, 0)
            wall_s = time.perf_counter() - started
            stdout = proc.stdout.read().decode() if proc.stdout else ""
            stderr = proc.stderr.read().decode() if proc.stderr else ""
            if status != 0:
                raise SystemExit(f"generate_report failed: {stderr[-2000:]}")
            sizes = {
                "esrs-e1" if p.name.endswith("-esrs-e1.csv") else p.suffix.lstrip("."): p.stat().st_size
                for p in out.iterdir()
            }
            runs.append(
                {"wall_s": round(wall_s, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "sizes": sizes}
            )
            print(stdout.strip().splitlines()[-1], runs[-1], flush=True)
        result = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "db": args.db,
            "requests": generated.requests,
            "ledger_records": generated.records,
            "generate_ledger_s": round(generated.seconds, 1),
            "rollups_s": round(rollup_s, 1),
            "full_verification_s": round(verify_s, 1),
            "report_runs": runs,
            "targets": {"wall_s": 30, "peak_rss_mb": 1024},
            "cpus": os.cpu_count(),
        }
        print(json.dumps(result, indent=2))
        write_json(RESULTS_DIR / f"report-{args.db}-{utc_stamp()}.json", result)
    finally:
        connection.close()
        if args.keep:
            print(f"kept the database: {url}")
        else:
            drop_database(url)


if __name__ == "__main__":
    main()
