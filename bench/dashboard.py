"""Dashboard pages: server time per page, p95 over 50 loads, for an organization with N request records.

Reuses a database that ``bench/report.py --keep`` filled (a month of 10 M synthetic requests, rollups up to
date), signs a user in, and times each page through Django's full request handling in this process
(middleware, session, view, template) -- the server's share of a page load, without network or browser.

Target (issue 6): each page at most 200 ms server time, p95 over 50 loads.

Usage:
  .venv/bin/python bench/report.py --db postgres --requests 10000000 --keep   # prints the database URL
  .venv/bin/python bench/dashboard.py --database-url postgres://postgres@127.0.0.1:5432/cl_bench_...
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, setup_django, utc_stamp, write_json

# Every page the dashboard serves, a month's range with a model filter on the pages that take one, and the
# data endpoints the pages call from the browser (the overview's refresh, a report's progress, the carbon API).
RANGE = "start=2026-10-01&end=2026-10-31"
PAGES = (
    "/dashboard/",
    "/dashboard/?partial=1",
    f"/dashboard/?{RANGE}&model=linear",
    "/dashboard/models",
    f"/dashboard/models?{RANGE}&model=linear",
    "/dashboard/energy",
    f"/dashboard/energy?{RANGE}",
    "/dashboard/carbon",
    f"/dashboard/carbon?{RANGE}&model=linear",
    "/dashboard/reports",
    "/dashboard/jobs",
    "/dashboard/settings",
    "/dashboard/settings/organization",
    "/dashboard/settings/sites",
    "/dashboard/settings/devices",
    "/dashboard/settings/keys",
    "/dashboard/settings/instruments",
    "/dashboard/settings/imports",
    "/api/v1/",
    "/api/v1/carbon?start=2026-10-01T00:00:00Z&end=2026-11-01T00:00:00Z",
    "/api/v1/rollups?start=2026-10-01T00:00:00Z&end=2026-11-01T00:00:00Z",
    "/api/v1/ledger/requests?limit=100",
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--loads", type=int, default=50)
    parser.add_argument(
        "--now", default="2026-10-31T23:30:00+00:00", help="the dashboard's 'now' (end of the data)"
    )
    args = parser.parse_args()
    setup_django(args.database_url)
    from django.contrib.auth.models import User
    from django.test import Client

    from tenancy.models import Organization
    from tenancy.services import user_create

    org = Organization.objects.get(slug="bench")
    if not User.objects.filter(username="bench-admin").exists():
        user_create(organization=org, username="bench-admin", password="bench-password-42", role="admin")
    client = Client()
    assert client.login(username="bench-admin", password="bench-password-42")
    now = datetime.fromisoformat(args.now)
    results = {}
    # The data ends where the synthetic month ends; pin the dashboard's clock there so "today" and "this
    # month" have data, as they would on a live system.
    with mock.patch("django.utils.timezone.now", return_value=now):
        for page in PAGES:
            client.get(page)  # warm: first-use imports and template compilation
            times = []
            for _ in range(args.loads):
                started = time.perf_counter()
                response = client.get(page)
                times.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200, (page, response.status_code)
            times.sort()
            results[page] = {
                "p50_ms": round(statistics.median(times), 1),
                "p95_ms": round(times[int(len(times) * 0.95) - 1], 1),
                "max_ms": round(times[-1], 1),
                "bytes": len(response.content),
            }
            print(page, results[page], flush=True)
    out = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "database": args.database_url.split(":", 1)[0],
        "loads": args.loads,
        "pages": results,
        "target_p95_ms": 200,
    }
    write_json(RESULTS_DIR / f"dashboard-{utc_stamp()}.json", out)


if __name__ == "__main__":
    main()
