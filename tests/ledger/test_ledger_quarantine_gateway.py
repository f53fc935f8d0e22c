"""A refused record in a real gateway's spool (issue 22, finding 1), end to end: ``manage.py serve`` with its
drainer process on its own database (a SQLite file, or a fresh PostgreSQL database in the suite's PostgreSQL
run), never pytest-django's. The good records around the refused one reach the database within seconds, the
gateway keeps serving and stays ready, /metrics counts the quarantined record, the operator's command lists it
and resolves it (a retry after widening the column on PostgreSQL, a dismissal on SQLite, which cannot be fixed
there), and ``verify_ledger`` passes throughout.
"""

from __future__ import annotations

import contextlib
import http.client
import re
from collections.abc import Iterator
from pathlib import Path

import orjson
import psycopg
import pytest

from inference.spool import Spool
from tests.support.gateway_process import (
    GatewayProcess,
    LedgerDatabase,
    fresh_postgres_database,
    gateway_env,
    infer_once,
    manage,
    postgres_url_from_env,
    prepare_gateway,
    wait_until,
)
from tests.support.ledger import lines_for_batch

# Subprocesses on their own databases: pytest-django's test database is never touched.
pytestmark = pytest.mark.django_db(False)

POSTGRES_URL = postgres_url_from_env()
GAUGE = re.compile(rb"^carbonledger_ledger_quarantined_records (\d+)$", re.MULTILINE)


@contextlib.contextmanager
def ledger_database(var_dir: Path) -> Iterator[tuple[str | None, LedgerDatabase]]:
    """(DATABASE_URL for the gateway or None for its SQLite default, a direct reader of it)."""
    if POSTGRES_URL is None:
        yield None, LedgerDatabase(sqlite_path=var_dir / "carbonledger.sqlite3")
        return
    with fresh_postgres_database(POSTGRES_URL) as url:
        yield url, LedgerDatabase(postgres_url=url)


def _get(address: tuple[str, int], path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _quarantined_gauge(address: tuple[str, int]) -> int | None:
    status, body = _get(address, "/metrics")
    match = GAUGE.search(body) if status == 200 else None
    return int(match[1]) if match else None


def _spool_a_refused_record(spool_dir: Path, refused: dict[str, object]) -> tuple[list[str], bytes]:
    """Good batches with one request line the database refuses among them, spooled as a gateway would have
    before it stopped; returns the good request ids and the refused line."""
    good: list[str] = []
    with Spool(spool_dir) as spool:
        for n in range(3):
            lines, ids = lines_for_batch(None, requests=3, prefix="e2e")
            good.extend(ids)
            if n == 1:
                record = {**orjson.loads(lines[2]), "request_id": "e2e.refused", **refused}
                bad = orjson.dumps(record) + b"\n"
                lines = [*lines[:3], bad, *lines[3:]]
            spool.append(b"".join(lines))
    return good, bad


def test_a_refused_record_in_a_live_gateways_spool_is_quarantined_counted_and_resolved(
    tmp_path: Path,
) -> None:
    var_dir = tmp_path / "var"
    postgres = POSTGRES_URL is not None
    # PostgreSQL refuses a client request id over its 256 characters; SQLite an integer beyond 64 bits.
    refused: dict[str, object] = {"client_request_id": "x" * 300} if postgres else {"work_units": 1 << 63}
    with ledger_database(var_dir) as (database_url, db):
        env = gateway_env(
            var_dir, database_url, LEDGER_STATUS_INTERVAL_S="0.2", LEDGER_WRITE_INTERVAL_S="0.1"
        )
        key = prepare_gateway(env)
        good, bad = _spool_a_refused_record(var_dir / "spool", refused)
        with GatewayProcess(env, tmp_path / "gateway.log") as gateway:
            gateway.start()

            def drained() -> bool:
                return good[-1] in db.request_id_counts()

            assert wait_until(drained, 15.0), f"the good records never arrived:\n{gateway.log_tail()}"
            counts = db.request_id_counts()
            assert all(counts[i] == 1 for i in good) and "e2e.refused" not in counts
            status, body = infer_once(gateway.address, key)
            assert status == 200, body
            served = orjson.loads(body)["parameters"]["ledger_id"]
            assert wait_until(lambda: served in db.request_id_counts(), 15.0), gateway.log_tail()
            assert wait_until(lambda: _quarantined_gauge(gateway.address) == 1, 10.0), _get(
                gateway.address, "/metrics"
            )
            families = re.findall(rb"^# TYPE (\S+)", _get(gateway.address, "/metrics")[1], re.MULTILINE)
            assert len(families) == len(set(families)), "a metric family is declared twice in /metrics"
            # Readiness is about serving, which goes on: a Kubernetes probe must not take the pod away for it.
            assert _get(gateway.address, "/v2/health/ready")[0] == 200
            rows = db.query("SELECT id, line, state FROM ledger_quarantine")
            assert [(bytes(line), state) for _id, line, state in rows] == [(bad.rstrip(b"\n"), "quarantined")]
            listing = manage(env, "ledger_quarantine")
            assert listing.returncode == 0 and "e2e.refused" in listing.stdout, listing

            if postgres:  # the fix: the column widened, then the record retried
                assert database_url is not None
                with psycopg.connect(database_url, autocommit=True) as conn:
                    conn.execute(
                        "ALTER TABLE ledger_request ALTER COLUMN client_request_id TYPE varchar(512)"
                    )
                resolved = manage(env, "ledger_quarantine", "--retry")
            else:  # SQLite can never store it: given up, in the chain
                resolved = manage(env, "ledger_quarantine", "--dismiss", str(rows[0][0]), "--reason", "test")
            assert resolved.returncode == 0, resolved.stdout + resolved.stderr
            assert wait_until(lambda: _quarantined_gauge(gateway.address) == 0, 10.0)
            assert ("e2e.refused" in db.request_id_counts()) == postgres
            status, body = infer_once(
                gateway.address, key
            )  # the drainer goes on after the operator's records
            assert status == 200, body
            served = orjson.loads(body)["parameters"]["ledger_id"]
            assert wait_until(lambda: served in db.request_id_counts(), 15.0), gateway.log_tail()
            assert gateway.terminate(), gateway.log_tail()
        verified = manage(env, "verify_ledger")
        assert verified.returncode == 0, verified.stdout + verified.stderr
