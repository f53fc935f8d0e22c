"""The ledger as it grows: ingest rate, a month's report and full verification, small ledger against large.

Two steps, so that the slow part (writing tens of millions of synthetic records) need not run on a quiet
machine and the measurement does:

``load``: a new PostgreSQL database with ``--months`` months of ``load_demo_ledger``'s synthetic traffic
(``--per-month`` requests each, the last month October 2026), ``VACUUM ANALYZE`` (autovacuum's work), the
rollups and an incremental verification as the scheduled tasks would leave them; the database is kept.

``measure``: on each given database, in alternating rounds (A B B A ...), each in a child process:

- **ingest**: the real ``LedgerWriter`` draining a producer's spool for ``--ingest-seconds`` (the
  ``ledger_ingest.py`` set-up: batches of 16 requests with their intervals and energy rows): request
  records/s, and the CPU the ledger's side spent a record (drainer, preparer, PostgreSQL backend);
- **report**: the rollups brought up to date and an incremental verification (as the scheduled tasks run),
  then ``manage.py generate_report`` for October 2026 (a month of ``--per-month`` requests in every database)
  in a child process: wall time and peak RSS;
- **full verification** (``--verify``): every chain from genesis, records/s.

Each ingest adds its requests to that ledger: the sizes reported are those when the measurement ran. Flat
(issue 24): the largest ledger's median ingest rate and report time within 20 % of the smallest's.

Usage:
  .venv/bin/python bench/ledger_scale.py load --months 1 --per-month 10000000    # prints the database URL
  .venv/bin/python bench/ledger_scale.py load --months 4 --per-month 10000000
  .venv/bin/python bench/ledger_scale.py measure --database-url URL1 --database-url URL4 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import (  # noqa: E402
    CLK_TCK,
    RESULTS_DIR,
    git,
    group_cpu_seconds,
    machine_busy_ticks,
    proc_stat,
    setup_django,
    use_database,
    utc_stamp,
    write_json,
)
from ledger_ingest import open_spool_reader  # noqa: E402

LAST_MONTH = (
    2026,
    10,
)  # the synthetic months end with this one, the month reported (the ingest writes "now")


def month_bounds(back: int) -> tuple[datetime, datetime]:
    """The first and the day after the last of the month ``back`` months before LAST_MONTH."""
    year, month = LAST_MONTH
    index = year * 12 + month - 1 - back
    start = datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)
    index += 1
    return start, datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def busy_fraction(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Share of the machine's CPU time that was busy between two ``machine_busy_ticks`` readings."""
    busy, total = after[0] - before[0], after[1] - before[1]
    return round(busy / total, 3) if total else 0.0


def own_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process and its reaped children (0 when it is gone)."""
    fields = proc_stat(pid)
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK_TCK if fields else 0.0


def ingest(workdir: Path, org_id: int, seconds: float) -> dict[str, Any]:
    """The real LedgerWriter draining a producer process's spool for ``seconds`` (as ledger_ingest.py).

    Besides the rate, the CPU the ledger's side spent a request record: this process (the drainer's threads
    and its preparer child) and its PostgreSQL backend, without the producer (the gateway's part). On a
    shared machine the rate moves with the neighbours' load; the CPU a record much less."""
    from django.db import connection

    from ledger.models import LedgerRequest
    from ledger.writer import DRAINER_SWITCH_INTERVAL_S, LedgerWriter

    run = f"scale{time.time_ns()}"
    spool_dir = workdir / run
    producer = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "ledger_ingest.py"), "--produce", str(spool_dir),
         "--org", str(org_id), "--backlog-mb", "32", "--prefix", run],
        cwd=ROOT,
    )  # fmt: skip
    try:
        reader = open_spool_reader(spool_dir)
        writer = LedgerWriter(reader)
        switch = sys.getswitchinterval()
        sys.setswitchinterval(DRAINER_SWITCH_INTERVAL_S)  # as the drain_ledger process sets it
        writer.recover()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend = cursor.fetchone()[0]
        time.sleep(1.0)  # a backlog to start from
        group = os.getpgrp()
        ticks = machine_busy_ticks()
        cpu0 = group_cpu_seconds(group) - own_cpu_seconds(producer.pid) + own_cpu_seconds(backend)
        start = time.perf_counter()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            writer.drain_available(until=end)
        elapsed = time.perf_counter() - start
        busy = busy_fraction(ticks, machine_busy_ticks())
        writer.stop()  # its preparer child exits and is reaped: its CPU counts in this process's
        cpu1 = group_cpu_seconds(group) - own_cpu_seconds(producer.pid) + own_cpu_seconds(backend)
        sys.setswitchinterval(switch)
    finally:
        producer.terminate()
        producer.wait(10)
    committed = LedgerRequest.objects.filter(chain__chain_id=reader.chain_id).count()
    return {
        "seconds": round(elapsed, 2),
        "request_records": committed,
        "request_records_per_s": round(committed / elapsed),
        "cpu_us_per_request_record": round((cpu1 - cpu0) / committed * 1e6, 2) if committed else None,
        "machine_busy": busy,
    }


def report(url: str, workdir: Path, start: datetime, end: datetime) -> dict[str, Any]:
    """``generate_report`` for [start, end) in a child process: wall time and peak RSS."""
    out = workdir / f"report-{start:%Y%m}"
    last_day = end.date().toordinal() - 1
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "generate_report", "--org", "bench", "--start", f"{start:%Y-%m-%d}",
         "--end", datetime.fromordinal(last_day).strftime("%Y-%m-%d"), "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url, "LOG_LEVEL": "WARNING"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    _, status, usage = os.wait4(proc.pid, 0)
    wall_s = time.perf_counter() - t
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if status != 0:
        raise SystemExit(f"generate_report failed: {stderr[-2000:]}")
    return {"wall_s": round(wall_s, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}


def load(months: int, per_month: int) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="cl-ledger-scale-"))
    url = use_database("postgres", workdir)
    setup_django()
    from django.core.management import call_command
    from django.db import connection

    from carbon.rollups import rollups_update
    from carbon.services import load_shipped_factors
    from demo.synthetic_ledger import generate_ledger
    from ledger.models import period_of_ns
    from ledger.partitions import PARTITIONED_TABLES, create_partition
    from ledger.services import ledger_verify
    from tenancy.services import organization_create

    call_command("migrate", verbosity=0)
    load_shipped_factors()
    org = organization_create(slug="bench", name="Benchmark Inference Ltd")
    t = time.perf_counter()
    for back in reversed(range(months)):
        start, end = month_bounds(back)
        # Each month in a partition of its own, as a ledger that was partitioned while it grew holds it
        # (migrations create only this month's and the next ones'; a past month would land in the default).
        for table in PARTITIONED_TABLES:
            create_partition(table, period_of_ns(int(start.timestamp()) * 10**9))
        generated = generate_ledger(
            organization=org, requests=per_month, days=(end - start).days, end=end, seed=100 + back
        )
        print(f"{start:%Y-%m}: {generated.requests} requests, {generated.records} records", flush=True)
    load_s = time.perf_counter() - t
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    rollups_update()
    ledger_verify()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        size_gb = cursor.fetchone()[0] / 1e9
    connection.close()
    print(json.dumps({"database_url": url, "months": months, "per_month": per_month, "load_s": round(load_s),
                      "database_gb": round(size_gb, 2)}))  # fmt: skip


def measure_one(url: str, ingest_seconds: float, verify: bool) -> dict[str, Any]:
    """One round on one database (run in a child process: Django holds one database a process)."""
    setup_django(url)
    from django.db import connection

    from carbon.rollups import rollups_update
    from ledger.models import LedgerRequest
    from ledger.services import ledger_verify
    from tenancy.models import Organization

    workdir = Path(tempfile.mkdtemp(prefix="cl-ledger-scale-"))
    os.environ["CARBONLEDGER_VAR_DIR"] = str(workdir)
    org = Organization.objects.get(slug="bench")
    row: dict[str, Any] = {"requests_before": LedgerRequest.objects.count()}
    row["ingest"] = ingest(workdir, org.pk, ingest_seconds)
    t = time.perf_counter()
    rollups_update()
    row["rollups_s"] = round(time.perf_counter() - t, 1)
    ledger_verify()  # incremental, so the report's own verification is as small as in production
    if verify:
        ticks = machine_busy_ticks()
        t = time.perf_counter()
        runs = ledger_verify(full=True)
        verify_s = time.perf_counter() - t
        records = sum(r.records for r in runs)
        row["full_verification"] = {
            "seconds": round(verify_s, 1),
            "records": records,
            "records_per_s": round(records / verify_s) if verify_s else None,
            "intact": all(not r.problem for r in runs),
            "machine_busy": busy_fraction(ticks, machine_busy_ticks()),
        }
    row["requests_after"] = LedgerRequest.objects.count()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        row["database_gb"] = round(cursor.fetchone()[0] / 1e9, 2)
    connection.close()
    start, end = month_bounds(0)
    ticks = machine_busy_ticks()
    row["report"] = report(url, workdir, start, end)
    row["report"]["machine_busy"] = busy_fraction(ticks, machine_busy_ticks())
    return row


def measure(urls: list[str], rounds: int, ingest_seconds: float, verify: bool) -> None:
    order: list[str] = []
    for r in range(rounds):
        order.extend(urls if r % 2 == 0 else list(reversed(urls)))
    runs: dict[str, list[dict[str, Any]]] = {u: [] for u in urls}
    for i, url in enumerate(order):
        out = Path(tempfile.mkdtemp(prefix="cl-ledger-scale-")) / "row.json"
        argv = [sys.executable, __file__, "measure-one", "--database-url", url, "--out", str(out),
                "--ingest-seconds", str(ingest_seconds)] + (["--verify"] if verify and i < len(urls) else [])  # fmt: skip
        subprocess.run(argv, check=True, cwd=ROOT)
        row = json.loads(out.read_text())
        runs[url].append(row)
        print(url.rsplit("/", 1)[-1], json.dumps(row), flush=True)

    def median(url: str, *path: str) -> float:
        values = []
        for row in runs[url]:
            value: Any = row
            for key in path:
                value = value[key]
            values.append(float(value))
        return statistics.median(values)

    sizes = {u: min(row["requests_before"] for row in runs[u]) for u in urls}
    small, large = min(urls, key=sizes.__getitem__), max(urls, key=sizes.__getitem__)
    databases = [
        {
            "database": u.rsplit("/", 1)[-1],
            "requests_in_ledger": sizes[u],
            "ingest_request_records_per_s_median": median(u, "ingest", "request_records_per_s"),
            "ingest_cpu_us_per_request_record_median": median(u, "ingest", "cpu_us_per_request_record"),
            "report_wall_s_median": median(u, "report", "wall_s"),
            "runs": runs[u],
        }
        for u in urls
    ]
    flat = {
        "ledger_size_ratio": round(sizes[large] / sizes[small], 2),
        "ingest_rate_ratio": round(
            median(large, "ingest", "request_records_per_s")
            / median(small, "ingest", "request_records_per_s"),
            3,
        ),
        "ingest_cpu_ratio": round(
            median(large, "ingest", "cpu_us_per_request_record")
            / median(small, "ingest", "cpu_us_per_request_record"),
            3,
        ),
        "report_time_ratio": round(median(large, "report", "wall_s") / median(small, "report", "wall_s"), 3),
        "target": "the largest ledger's ingest rate >= 0.8x and report time <= 1.2x the smallest's",
    }
    flat["met"] = flat["ingest_rate_ratio"] >= 0.8 and flat["report_time_ratio"] <= 1.2
    result = {
        "benchmark": "ledger_scale",
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "db": "postgres",
        "rounds": rounds,
        "ingest_seconds": ingest_seconds,
        "cpus": os.cpu_count(),
        "databases": databases,
        "flat": flat,
    }
    print(json.dumps(flat, indent=2))
    write_json(RESULTS_DIR / f"ledger_scale-{utc_stamp()}.json", result)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_load = sub.add_parser("load", help="write a new database of synthetic months (kept)")
    p_load.add_argument("--months", type=int, required=True)
    p_load.add_argument("--per-month", type=int, default=10_000_000)
    for name in ("measure", "measure-one"):
        p = sub.add_parser(name)
        p.add_argument("--database-url", action="append", required=True)
        p.add_argument("--ingest-seconds", type=float, default=60.0)
        p.add_argument("--verify", action="store_true", help="a full verification (first round)")
        if name == "measure":
            p.add_argument("--rounds", type=int, default=2)
        else:
            p.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "load":
        load(args.months, args.per_month)
    elif args.command == "measure":
        measure(args.database_url, args.rounds, args.ingest_seconds, args.verify)
    else:
        row = measure_one(args.database_url[0], args.ingest_seconds, args.verify)
        args.out.write_text(json.dumps(row))


if __name__ == "__main__":
    main()
