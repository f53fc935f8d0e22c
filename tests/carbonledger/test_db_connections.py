"""Database connections of a serving replica on PostgreSQL: none persistent under ASGI, and with the pool on
(CARBONLEDGER_DB_POOL_MAX_SIZE) never more than its documented bound, however many API reads run at once.

The bound (docs/operations.md): each process that uses Django's connections holds at most
CARBONLEDGER_DB_POOL_MAX_SIZE of them; a replica is its `manage.py serve` process plus its ledger writer
process (`drain_ledger`, which opens one more connection of its own for its COPY preparer), so a replica holds
at most 2 x CARBONLEDGER_DB_POOL_MAX_SIZE + 1.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.gateway_process import (
    GatewayProcess,
    gateway_env,
    manage,
    postgres_url_from_env,
    prepare_gateway,
)

pytestmark = pytest.mark.skipif(
    postgres_url_from_env() is None, reason="connection counts are a PostgreSQL matter (set DATABASE_URL)"
)

READS = 240
CONCURRENCY = 8


def _psycopg(url: str) -> Any:
    import psycopg

    return psycopg.connect("postgresql" + url[url.index(":") :], autocommit=True, connect_timeout=10)


class ConnectionSampler:
    """Counts, every few milliseconds, the other sessions connected to one database, by application_name."""

    def __init__(self, database_url: str) -> None:
        self._conn = _psycopg(database_url)
        self._name = database_url.rsplit("/", 1)[1].split("?", 1)[0]
        self.peak_total = 0
        self.peak_by_name: Counter[str] = Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pg-connection-sampler", daemon=True)

    def now(self) -> Counter[str]:
        rows = self._conn.execute(
            "SELECT coalesce(application_name, ''), count(*) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid() GROUP BY 1",
            (self._name,),
        ).fetchall()
        return Counter({name: int(n) for name, n in rows})

    def peak_over(self, seconds: float) -> Counter[str]:
        """The most connections of each process seen in ``seconds`` of samples."""
        peak: Counter[str] = Counter()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for name, n in self.now().items():
                peak[name] = max(peak[name], n)
            time.sleep(0.01)
        return peak

    def _run(self) -> None:
        while not self._stop.is_set():
            counts = self.now()
            self.samples += 1
            self.peak_total = max(self.peak_total, sum(counts.values()))
            for name, n in counts.items():
                self.peak_by_name[name] = max(self.peak_by_name[name], n)
            self._stop.wait(0.005)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def close(self) -> None:
        self._conn.close()


def _read_ledger(
    address: tuple[str, int], key: str, n: int, statuses: Counter[int], lock: threading.Lock
) -> None:
    conn = http.client.HTTPConnection(*address, timeout=60)
    try:
        for _ in range(n):
            conn.request(
                "GET", "/api/v1/ledger/requests?limit=20", headers={"Authorization": f"Bearer {key}"}
            )
            resp = conn.getresponse()
            resp.read()
            with lock:
                statuses[resp.status] += 1
    finally:
        conn.close()


def _concurrent_reads(address: tuple[str, int], key: str) -> Counter[int]:
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    threads = [
        threading.Thread(target=_read_ledger, args=(address, key, READS // CONCURRENCY, statuses, lock))
        for _ in range(CONCURRENCY)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "ledger reads did not finish within 300 s"
    return statuses


@pytest.fixture
def replica(tmp_path: Path, database_url: str) -> Iterator[tuple[dict[str, str], str]]:
    env = gateway_env(tmp_path / "var", database_url, LEDGER_WRITER="process")
    key = prepare_gateway(env)
    done = manage(env, "load_demo_ledger", "--org", "acme", "--requests", "200", "--days", "1", "--no-rollup")
    assert done.returncode == 0, done.stderr[-2000:]
    yield env, key


def test_a_replica_under_concurrent_api_reads_stays_within_its_pool_bound(
    tmp_path: Path, database_url: str, replica: tuple[dict[str, str], str]
) -> None:
    env, key = replica
    pool_max = 2
    # The lease keepers and the status threads go round every second or so during the reads: what they hold
    # between rounds would starve the requests of a small pool.
    env = {
        **env,
        "CARBONLEDGER_DB_POOL_MAX_SIZE": str(pool_max),
        "LEDGER_CHAIN_LEASE_TTL_S": "3",
        "DEVICE_LEASE_TTL_S": "3",
        "LEDGER_STATUS_INTERVAL_S": "1",
        "CARBONLEDGER_GRPC_PORT": "0",
    }
    bound = 2 * pool_max + 1
    sampler = ConnectionSampler(database_url)
    try:
        with GatewayProcess(env, tmp_path / "serve.log").start() as server, sampler:
            statuses = _concurrent_reads(server.address, key)
        assert statuses == Counter({200: READS}), f"answers: {dict(statuses)}\n{server.log_tail()}"
        assert sampler.samples > 50
        assert sampler.peak_total <= bound, (
            f"{sampler.peak_total} connections at peak, bound {bound}: {dict(sampler.peak_by_name)}"
        )
        # Every connection says which process holds it, and the serving process alone stays within its pool.
        assert "" not in sampler.peak_by_name, dict(sampler.peak_by_name)
        assert 1 <= sampler.peak_by_name["carbonledger serve"] <= pool_max, dict(sampler.peak_by_name)
    finally:
        sampler.close()


def test_without_a_pool_no_connection_outlives_the_request_that_opened_it(
    tmp_path: Path, database_url: str, replica: tuple[dict[str, str], str]
) -> None:
    """Under ASGI every request runs on a thread of its own: a persistent connection (CONN_MAX_AGE > 0) stays
    open after its thread is gone, so a serving process piled them up. With none persistent, once the reads are
    answered the serving process is back to what its background threads hold between their rounds."""
    env, key = replica
    env = {**env, "LEDGER_CHAIN_LEASE_TTL_S": "3", "DEVICE_LEASE_TTL_S": "3", "CARBONLEDGER_GRPC_PORT": "0"}
    sampler = ConnectionSampler(database_url)
    try:
        with GatewayProcess(env, tmp_path / "serve.log").start() as server:
            time.sleep(2.0)  # the lease keepers (a round a second here) have been round
            before = sampler.peak_over(2.0)
            statuses = _concurrent_reads(server.address, key)
            assert statuses == Counter({200: READS}), f"answers: {dict(statuses)}\n{server.log_tail()}"
            time.sleep(1.0)  # a connection closes when its request's response is done
            after = sampler.peak_over(2.0)
        assert after["carbonledger serve"] <= max(before["carbonledger serve"], 1) + 1, (before, after)
        assert after["carbonledger serve"] <= 4, (before, after)
    finally:
        sampler.close()
