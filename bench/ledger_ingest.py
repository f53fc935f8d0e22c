"""Ledger ingest: request records per second from the spool into SQLite or PostgreSQL, sustained.

A producer process spools a realistic mix as the gateway would (per batch of 16 requests: one
batch record, 16 request records, and, per closed interval, the interval, its idle line and
the batch's energy row with its split over the 16 requests); the real LedgerWriter drains it into the database (hash chain,
COPY on PostgreSQL, executemany on SQLite). The producer keeps a bounded backlog ahead of the
writer, so the measured rate is the writer's. Reports request records/s over the whole run,
the process's peak RSS, and checks the chain afterwards.

Usage:
  .venv/bin/python bench/ledger_ingest.py --db sqlite --seconds 60
  .venv/bin/python bench/ledger_ingest.py --db postgres --seconds 60   # fresh database on 127.0.0.1:5432
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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

from common import RESULTS_DIR, drop_database, git, setup_django, use_database, write_json  # noqa: E402


def batch_lines(n: int, org_id: int, t0: int, prefix: str = "bench") -> tuple[bytes, int]:
    """Spool lines for batch ``n`` of 16 requests and its interval; returns (bytes, requests)."""
    reqs = 16
    b = f"{prefix}.b{n}"
    i = f"{prefix}.i{n}"
    start, end = t0 + n * 4_000_000, t0 + n * 4_000_000 + 2_000_000
    out = [
        f'{{"k":"batch","batch_id":"{b}","model":"linear","version":"1","device_id":"cpu-model","instance":0,'
        f'"start_ns":{start},"end_ns":{end},"requests":{reqs},"rows":{reqs},"status":"ok"}}'
    ]
    for r in range(reqs):
        out.append(
            f'{{"k":"req","request_id":"{b}.r{r}","client_request_id":"","organization_id":{org_id},'
            f'"api_key_id":null,"model":"linear","version":"1","batch_id":"{b}","device_id":"cpu-model",'
            f'"received_ns":{start - 500_000},"started_ns":{start},"finished_ns":{end},"queue_ns":500000,'
            f'"compute_ns":2000000,"work_units":256,"status":"ok"}}'
        )
    out.append(
        f'{{"k":"interval","interval_id":"{i}","device_id":"cpu-model","method":"modelled",'
        f'"relative_uncertainty":0.3,"t0_ns":{start},"t1_ns":{end + 2_000_000},"counter_start_j":{n * 0.2},'
        f'"counter_end_j":{n * 0.2 + 0.2},"energy_uj":200000,"idle_uj":8000,"busy_ns":2000000,"idle_ns":2000000}}'
    )
    out.append(
        f'{{"k":"idle","interval_id":"{i}","device_id":"cpu-model","t0_ns":{start},"t1_ns":{end + 2_000_000},'
        f'"energy_uj":8000,"idle_ns":2000000,"idle_power_w":2.0}}'
    )
    ids = ",".join(f'"{b}.r{r}"' for r in range(reqs))
    shares = ",".join(["12000"] * reqs)
    out.append(
        f'{{"k":"batch_energy","batch_id":"{b}","interval_id":"{i}","energy_uj":{12000 * reqs},'
        f'"request_ids":[{ids}],"shares_uj":[{shares}],"final":true}}'
    )
    return ("\n".join(out) + "\n").encode(), reqs


def produce(spool_dir: Path, org_id: int, backlog_mb: float, prefix: str = "bench") -> None:
    """The producer process: spool batches as fast as the drainer keeps up, ahead by backlog_mb."""
    from inference.spool import Spool

    spool = Spool(spool_dir, max_backlog_bytes=8 << 30)
    limit = int(backlog_mb * (1 << 20))
    t0 = time.time_ns()
    n = 0
    while True:
        spool.sync_acknowledged()
        if spool.backlog_bytes > limit:
            time.sleep(0.01)
            continue
        chunk = []
        for _ in range(64):
            data, _reqs = batch_lines(n, org_id, t0, prefix)
            chunk.append(data)
            n += 1
        spool.append(b"".join(chunk))


def open_spool_reader(spool_dir: Path, timeout_s: float = 30.0) -> Any:
    """A ``SpoolReader`` on the producer process's spool, once the producer has created it."""
    from inference.spool import SpoolReader

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return SpoolReader(spool_dir)
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--produce":
        ap = argparse.ArgumentParser()
        ap.add_argument("--produce", type=Path)
        ap.add_argument("--org", type=int)
        ap.add_argument("--backlog-mb", type=float)
        ap.add_argument("--prefix", default="bench", help="ids start with it (one per run into one database)")
        a = ap.parse_args()
        produce(a.produce, a.org, a.backlog_mb, a.prefix)
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--backlog-mb", type=float, default=32.0, help="how far the producer runs ahead")
    ap.add_argument("--out", default=str(RESULTS_DIR))
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="ledger-ingest-"))
    url = use_database(args.db, workdir)
    try:
        setup_django()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from ledger.models import LedgerRequest
        from ledger.verify import verify_all
        from ledger.writer import DRAINER_SWITCH_INTERVAL_S, LedgerWriter
        from tenancy.services import organization_create

        org = organization_create(slug="bench")
        # As in production: the gateway (here a producer process) appends to the spool, and the
        # drainer (this process) reads it with a SpoolReader and writes the database; two processes,
        # two GILs.
        spool_dir = workdir / "spool"
        producer = subprocess.Popen(
            [sys.executable, __file__, "--produce", str(spool_dir), "--org", str(org.pk),
             "--backlog-mb", str(args.backlog_mb)],
            cwd=ROOT,
        )  # fmt: skip
        writer = LedgerWriter(open_spool_reader(spool_dir))
        sys.setswitchinterval(DRAINER_SWITCH_INTERVAL_S)  # as the drain_ledger process sets it
        writer.recover()
        time.sleep(1.0)  # a backlog to start from
        start = time.perf_counter()
        written_lines = 0
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            # What the drain_ledger process runs: the next chunk is prepared while this one is inserted.
            written_lines += writer.drain_available(until=deadline)
        elapsed = time.perf_counter() - start
        writer.stop()  # and its preparer process, when the backlog started one
        producer.terminate()
        producer.wait(10)
        # The writer drains only inside the measured window, so every committed request record
        # was written during it.
        committed = LedgerRequest.objects.count()
        verify_t = time.perf_counter()
        reports = verify_all()
        verify_s = time.perf_counter() - verify_t
        peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        # The largest finished child: the producer, or the writer's preparer process (PostgreSQL backlog).
        peak_child_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        result = {
            "benchmark": "ledger_ingest",
            "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "git_commit": git("rev-parse", "--short", "HEAD"),
            "db": args.db,
            "seconds": round(elapsed, 2),
            "request_records": committed,
            "chained_records": sum(r.records for r in reports),
            "request_records_per_s": round(committed / elapsed),
            "spool_lines_per_s": round(written_lines / elapsed),
            "peak_rss_mb": round(peak_rss_mb, 1),
            "peak_child_rss_mb": round(peak_child_rss_mb, 1),
            "prepare_process": os.environ.get("LEDGER_PREPARE_PROCESS", "true"),
            "chain_intact": all(r.broken is None for r in reports),
            "verify_s": round(verify_s, 2),
            "target_per_s": 50_000 if args.db == "postgres" else 20_000,
        }
        result["meets_target"] = result["request_records_per_s"] >= result["target_per_s"]
        print(json.dumps(result, indent=2))
        out = Path(args.out)
        stamp = result["date_utc"].replace(":", "").replace("-", "")
        write_json(
            [out / f"ledger_ingest-{args.db}-{stamp}.json", out / f"ledger_ingest-{args.db}-latest.json"],
            result,
        )
        from django.db import connections

        connections.close_all()
        return 0
    finally:
        drop_database(url)


if __name__ == "__main__":
    sys.exit(main())
