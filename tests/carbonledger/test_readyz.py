"""/readyz of a real gateway process (``manage.py serve`` with its drainer process) on its own database, never
pytest-django's: the database goes away, the drainer stops, a record is quarantined; each turns /readyz 503
naming the check, while /v2/health/ready (KServe: the models are loaded) stays 200, and /readyz comes back to
200 when the cause is gone. Issue 23: readiness was 200 while the database was unreachable."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    with_database,
)
from tests.support.ledger import lines_for_batch
from tests.support.prometheus import parse_exposition, value

POSTGRES_URL = postgres_url_from_env()
NEEDS_POSTGRES = pytest.mark.skipif(
    POSTGRES_URL is None, reason="DATABASE_URL is not a postgres:// URL; this case runs on PostgreSQL only"
)
# Probes answer within a second and keep their answer 0.2 s here, so that the tests see changes quickly.
# No gRPC port: concurrent test gateways would all want the default one.
FAST = {
    "READY_CACHE_S": "0.2",
    "READY_DB_TIMEOUT_S": "2",
    "LEDGER_STATUS_INTERVAL_S": "0.2",
    "CARBONLEDGER_GRPC_PORT": "0",
}


@contextlib.contextmanager
def ledger_database(var_dir: Path) -> Iterator[tuple[str | None, LedgerDatabase]]:
    """(DATABASE_URL for the gateway or None for its SQLite default, a direct reader of it)."""
    if POSTGRES_URL is None:
        yield None, LedgerDatabase(sqlite_path=var_dir / "carbonledger.sqlite3")
        return
    with fresh_postgres_database(POSTGRES_URL) as url:
        yield url, LedgerDatabase(postgres_url=url)


def get(address: tuple[str, int], path: str, host: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host} if host else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def readyz(gateway: GatewayProcess) -> tuple[int, dict[str, Any]]:
    status, body = get(gateway.address, "/readyz")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = {"unparsed": body.decode("utf-8", "replace")}
    return status, doc


def wait_for_readyz(
    gateway: GatewayProcess, want_status: int, failing: str | None, timeout_s: float
) -> dict[str, Any]:
    """Until /readyz answers ``want_status`` (and names ``failing`` among its failed checks); its last body."""
    last: list[Any] = [None]

    def matches() -> bool:
        status, doc = readyz(gateway)
        last[0] = (status, doc)
        return status == want_status and (failing is None or failing in doc.get("failed", ()))

    assert wait_until(matches, timeout_s, interval_s=0.2), f"/readyz: {last[0]}\n{gateway.log_tail()}"
    return dict(last[0][1])


def drainer_pid(gateway_pid: int) -> int:
    """The gateway's ``manage.py drain_ledger`` child process."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == gateway_pid and b"drain_ledger" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    assert len(found) == 1, f"drainer processes of {gateway_pid}: {found}"
    return found[0]


@NEEDS_POSTGRES
def test_readyz_turns_503_naming_the_database_when_it_goes_away_while_v2_health_ready_stays_200(
    tmp_path: Path,
) -> None:
    assert POSTGRES_URL is not None
    var_dir = tmp_path / "var"
    with fresh_postgres_database(POSTGRES_URL) as url:
        name = url.rsplit("/", 1)[1]
        env = gateway_env(var_dir, url, **FAST)
        key = prepare_gateway(env)
        admin = psycopg.connect(
            "postgresql" + with_database(POSTGRES_URL, "postgres")[len("postgres") :], autocommit=True
        )
        with admin, GatewayProcess(env, tmp_path / "gateway.log") as gateway:
            gateway.start()
            ok = wait_for_readyz(gateway, 200, None, 30)
            assert ok["failed"] == [] and {"models", "database", "drainer", "drainer_lag", "spool"} <= set(
                ok["checks"]
            )
            assert infer_once(gateway.address, key)[0] == 200
            # The database goes away: no new connection is accepted, and every open one is cut.
            admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
            try:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                    "AND pid <> pg_backend_pid()",
                    [name],
                )
                down = wait_for_readyz(gateway, 503, "database", 15)
                assert not down["checks"]["database"]["ok"]
                assert down["checks"]["database"]["detail"], down
                # KServe's readiness is about the models, which are loaded: a probe of it stays 200.
                assert get(gateway.address, "/v2/health/ready")[0] == 200
                # Probes are answered by address, whatever the Host header (as /v2/health/*).
                status, body = get(gateway.address, "/readyz", host="10.1.2.3:8000")
                assert status == 503 and b"database" in body
                assert get(gateway.address, "/v2", host="10.1.2.3:8000")[0] == 400
            finally:
                admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
            wait_for_readyz(gateway, 200, None, 40)
            assert gateway.terminate(), gateway.log_tail()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=NEEDS_POSTGRES)])
def test_readyz_names_the_drainer_lag_when_the_drainer_stops_and_recovers_when_it_goes_on(
    backend: str, tmp_path: Path
) -> None:
    var_dir = tmp_path / "var"
    with contextlib.ExitStack() as stack:
        url = None
        if backend == "postgres":
            assert POSTGRES_URL is not None
            url = stack.enter_context(fresh_postgres_database(POSTGRES_URL))
        env = gateway_env(var_dir, url, READY_MAX_DRAIN_LAG_S="2", METER_INTERVAL_S="0.2", **FAST)
        key = prepare_gateway(env)
        gateway = stack.enter_context(GatewayProcess(env, tmp_path / "gateway.log"))
        gateway.start()
        wait_for_readyz(gateway, 200, None, 30)
        assert gateway.proc is not None
        pid = drainer_pid(gateway.proc.pid)
        os.kill(pid, signal.SIGSTOP)  # alive, but drains nothing: the spool's oldest record ages
        try:
            for _ in range(5):
                assert infer_once(gateway.address, key)[0] == 200  # spooled: answers go on
            down = wait_for_readyz(gateway, 503, "drainer_lag", 20)
            assert "database" not in down["failed"] and "models" not in down["failed"]
            detail = down["checks"]["drainer_lag"]["detail"]
            assert "2" in detail, detail  # names the limit
            assert get(gateway.address, "/v2/health/ready")[0] == 200
            families = parse_exposition(get(gateway.address, "/metrics")[1].decode())
            chain = (var_dir / "spool" / "chain_id").read_text().strip()
            assert value(families, "carbonledger_ledger_drain_lag_seconds", chain=chain) > 2
            assert value(families, "carbonledger_spool_backlog_bytes", chain=chain) > 0
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for_readyz(gateway, 200, None, 30)
        families = parse_exposition(get(gateway.address, "/metrics")[1].decode())
        assert value(families, "carbonledger_ledger_drain_lag_seconds", chain=chain) < 2
        assert gateway.terminate(), gateway.log_tail()


def _spool_a_refused_record(spool_dir: Path, refused: dict[str, object]) -> list[str]:
    """Good batches with one request line the database refuses among them, spooled as a gateway would have
    before it stopped; returns the good request ids."""
    good: list[str] = []
    with Spool(spool_dir) as spool:
        for n in range(2):
            lines, ids = lines_for_batch(None, requests=3, prefix="rz")
            good.extend(ids)
            if n == 1:
                record = {**orjson.loads(lines[2]), "request_id": "rz.refused", **refused}
                lines = [*lines[:3], orjson.dumps(record) + b"\n", *lines[3:]]
            spool.append(b"".join(lines))
    return good


def test_readyz_is_503_while_a_quarantined_record_is_unacknowledged(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    postgres = POSTGRES_URL is not None
    # PostgreSQL refuses a client request id over its 256 characters; SQLite an integer beyond 64 bits.
    refused: dict[str, object] = {"client_request_id": "x" * 300} if postgres else {"work_units": 1 << 63}
    with ledger_database(var_dir) as (database_url, db):
        env = gateway_env(var_dir, database_url, LEDGER_WRITE_INTERVAL_S="0.1", **FAST)
        key = prepare_gateway(env)
        good = _spool_a_refused_record(var_dir / "spool", refused)
        with GatewayProcess(env, tmp_path / "gateway.log") as gateway:
            gateway.start()
            assert wait_until(lambda: good[-1] in db.request_id_counts(), 15.0), gateway.log_tail()
            down = wait_for_readyz(gateway, 503, "ledger_quarantine", 15)
            assert down["failed"] == ["ledger_quarantine"], down
            assert "ledger_quarantine" in down["checks"]["ledger_quarantine"]["detail"]  # names the command
            assert get(gateway.address, "/v2/health/ready")[0] == 200
            assert infer_once(gateway.address, key)[0] == 200  # serving goes on
            (row_id,) = (r[0] for r in db.query("SELECT id FROM ledger_quarantine"))
            dismissed = manage(env, "ledger_quarantine", "--dismiss", str(row_id), "--reason", "test")
            assert dismissed.returncode == 0, dismissed.stdout + dismissed.stderr
            wait_for_readyz(gateway, 200, None, 15)
            assert gateway.terminate(), gateway.log_tail()
