"""Durability of the ledger against real failures of real gateway processes.

Each test runs ``manage.py serve`` as a subprocess on its own database (a SQLite file in a
temporary folder, or a fresh PostgreSQL database that is dropped afterwards), never on
pytest-django's test database, and checks the ledger from outside Django (sqlite3, psycopg).

* A gateway SIGKILLed under load: every request that was answered 200 must be in the ledger
  exactly once after a restart has replayed the spool, the hash chains intact and the energy
  of every interval conserved.
* A database outage (a TCP proxy in front of PostgreSQL is cut): the gateway keeps answering
  while its bounded spool grows, then refuses with 503 instead of answering unrecorded, and
  drains everything when the database returns.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.gateway_process import (
    GatewayProcess,
    LedgerDatabase,
    LoadClients,
    Outcomes,
    TcpProxy,
    fresh_postgres_database,
    gateway_env,
    infer_once,
    manage,
    postgres_url_from_env,
    prepare_gateway,
    spool_backlog_bytes,
    wait_until,
    with_database,
)

# Subprocesses on their own databases: pytest-django's test database is never touched.
pytestmark = pytest.mark.django_db(False)

POSTGRES_URL = postgres_url_from_env()
NEEDS_POSTGRES = pytest.mark.skipif(
    POSTGRES_URL is None, reason="DATABASE_URL is not a postgres:// URL; this case runs on PostgreSQL only"
)

DRAIN_TIMEOUT_S = 30.0


@contextlib.contextmanager
def ledger_database(backend: str, var_dir: Path) -> Iterator[tuple[str | None, LedgerDatabase]]:
    """(DATABASE_URL for the gateway or None for its SQLite default, a direct reader of it)."""
    if backend == "sqlite":
        yield None, LedgerDatabase(sqlite_path=var_dir / "carbonledger.sqlite3")
        return
    assert POSTGRES_URL is not None
    with fresh_postgres_database(POSTGRES_URL) as url:
        yield url, LedgerDatabase(postgres_url=url)


def wait_for_ledger(db: LedgerDatabase, ids: set[str], timeout_s: float = DRAIN_TIMEOUT_S) -> bool:
    """Until every id in ``ids`` is in ledger_request and its row count has stopped changing."""
    last = [-1]

    def settled() -> bool:
        counts = db.request_id_counts()
        total = sum(counts.values())
        done = ids <= counts.keys() and total == last[0]
        last[0] = total
        return done

    return wait_until(settled, timeout_s, interval_s=0.3)


def assert_exactly_once(db: LedgerDatabase, ids: list[str]) -> None:
    assert len(set(ids)) == len(ids), "the gateway answered two requests with the same ledger id"
    counts = db.request_id_counts()
    missing = [i for i in ids if counts[i] == 0]
    twice = {i: counts[i] for i in ids if counts[i] > 1}
    assert not missing, f"{len(missing)} of {len(ids)} answered requests are not in the ledger: {missing[:5]}"
    assert not twice, f"answered requests in the ledger more than once: {list(twice.items())[:5]}"


def assert_ledger_verifies(env: dict[str, str]) -> None:
    done = manage(env, "verify_ledger")
    assert done.returncode == 0, f"verify_ledger failed:\n{done.stdout}\n{done.stderr}"


def assert_energy_conserved(db: LedgerDatabase) -> int:
    checked, bad = db.conservation_violations()
    assert checked > 0, "no interval reached the ledger: nothing was checked"
    assert not bad, (
        f"{len(bad)} of {checked} intervals break parts + idle == energy "
        f"(interval_id, energy_uj, idle_uj, parts_uj): {bad[:5]}"
    )
    assert db.orphan_energy_parts() == 0, "request energy parts name intervals that are not in the ledger"
    return checked


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=NEEDS_POSTGRES)])
def test_requests_answered_before_sigkill_are_in_the_ledger_exactly_once(
    backend: str, tmp_path: Path
) -> None:
    var_dir = tmp_path / "var"
    with ledger_database(backend, var_dir) as (database_url, db):
        env = gateway_env(var_dir, database_url)
        key = prepare_gateway(env)
        first = GatewayProcess(env, tmp_path / "gateway-1.log")
        second = GatewayProcess(env, tmp_path / "gateway-2.log")
        clients: LoadClients | None = None
        try:
            first.start()
            clients = LoadClients(first.address, key, threads=8, max_seconds=15, max_requests=200_000).start()
            # Load for ~2.5 s, then kill the process group while requests are in flight.
            time.sleep(2.5)
            with clients.outcomes.lock:
                answered_before_kill = len(clients.outcomes.ok_ids)
                in_flight_at_kill = clients.outcomes.in_flight
            first.kill()
            clients.stop_event.set()  # no new requests: what fails now was in flight
            outcomes = clients.stop()
            clients = None

            assert answered_before_kill > 0, f"no request was answered before the kill:\n{first.log_tail()}"
            assert in_flight_at_kill > 0, "no request was in flight when the gateway was killed"
            assert outcomes.no_answer > 0, "no request lost its connection when the gateway was killed"
            assert set(outcomes.statuses) == {200}, (
                f"answers other than 200 under load: {outcomes.statuses}, {outcomes.unexpected[:3]}"
            )
            answered = outcomes.ok_ids

            second.start()
            drained = wait_for_ledger(db, set(answered))
            assert second.terminate(), f"the restarted gateway did not stop cleanly:\n{second.log_tail()}"
            assert drained, (
                f"the restarted gateway did not drain the spool within {DRAIN_TIMEOUT_S} s:\n{second.log_tail()}"
            )

            assert_exactly_once(db, answered)
            assert_ledger_verifies(env)
            intervals = assert_energy_conserved(db)
            print(
                f"[{backend}] {len(answered)} answered 200, {in_flight_at_kill} in flight at the kill "
                f"({outcomes.no_answer} lost their connection); {sum(db.request_id_counts().values())} "
                f"requests and {intervals} intervals in the ledger"
            )
        finally:
            if clients is not None:
                clients.stop_event.set()
            first.kill()
            second.kill()


@dataclass
class OutageRig:
    gateway: GatewayProcess
    proxy: TcpProxy
    db: LedgerDatabase  # direct to 5432, not through the proxy
    env: dict[str, str]
    key: str
    spool_dir: Path

    def backlog(self) -> int:
        return spool_backlog_bytes(self.spool_dir, self.db)

    def send(self, outcomes: Outcomes, n: int) -> Outcomes:
        for _ in range(n):
            outcomes.record(*infer_once(self.gateway.address, self.key))
        return outcomes


@contextlib.contextmanager
def gateway_behind_a_proxy(tmp_path: Path, **settings: str) -> Iterator[OutageRig]:
    """A fresh PostgreSQL database that the gateway (and its set-up) reaches only through a
    TCP proxy the test can cut; the test reads the ledger directly on 5432."""
    assert POSTGRES_URL is not None
    var_dir = tmp_path / "var"
    with fresh_postgres_database(POSTGRES_URL) as direct_url, TcpProxy(("127.0.0.1", 5432)) as proxy:
        proxied_url = with_database(direct_url, direct_url.rsplit("/", 1)[1], port=proxy.port)
        env = gateway_env(var_dir, proxied_url, **settings)
        key = prepare_gateway(env)
        gateway = GatewayProcess(env, tmp_path / "gateway.log")
        try:
            gateway.start()
            yield OutageRig(
                gateway, proxy, LedgerDatabase(postgres_url=direct_url), env, key, var_dir / "spool"
            )
        finally:
            gateway.kill()


# API_KEY_CACHE_SECONDS=300 keeps the key lookups out of these outages: a lookup during an
# outage is a bug of its own (test_database_outage_longer_than_the_api_key_cache_...).
SPOOL_LIMIT = 131072
OUTAGE_SETTINGS = {"SPOOL_MAX_BYTES": str(SPOOL_LIMIT), "API_KEY_CACHE_SECONDS": "300"}


def fill_the_spool(rig: OutageRig, outcomes: Outcomes, refusals: int = 50) -> tuple[bool, int]:
    """Load with 4 clients until ``refusals`` spool-full 503s (bounded); (refused, peak backlog)."""
    clients = LoadClients(rig.gateway.address, rig.key, threads=4, max_seconds=30, outcomes=outcomes)
    peak = 0

    def refusing() -> bool:
        nonlocal peak
        peak = max(peak, rig.backlog())
        return outcomes.snapshot()[1] >= refusals

    try:
        clients.start()
        refused = wait_until(refusing, 30.0, interval_s=0.05)
    finally:
        clients.stop()
    return refused, max(peak, rig.backlog())


@NEEDS_POSTGRES
def test_database_outage_keeps_serving_then_refuses_when_the_spool_is_full_and_drains_on_return(
    tmp_path: Path,
) -> None:
    # PostgreSQL only: the SQLite run has no database server to take away.
    with gateway_behind_a_proxy(tmp_path, **OUTAGE_SETTINGS) as rig:
        before = rig.send(Outcomes(), 20)
        assert before.statuses == {200: 20}, f"{before.statuses} {before.unexpected[:3]}"
        assert wait_for_ledger(rig.db, set(before.ok_ids)), "the first requests never reached the database"

        # Outage: answers go on while the spool grows, then 503 once it is full.
        rig.proxy.cut()
        outage = Outcomes()
        refused, peak = fill_the_spool(rig, outage)
        ok, full, _ = outage.snapshot()
        print(
            f"outage: {ok} answered 200, {full} answered 503 (spool full), {len(outage.unexpected)} other, "
            f"{outage.no_answer} without an answer; spool backlog peaked at {peak} bytes (limit {SPOOL_LIMIT})"
        )
        assert refused, (
            f"no 503 for a full spool during the outage: {outage.statuses}\n{rig.gateway.log_tail()}"
        )
        assert ok > 0, "no request was answered during the outage although the spool had room"
        assert not outage.unexpected and outage.no_answer == 0, (
            f"during the outage, answers other than 200 and 503-spool-full: {outage.statuses}; "
            f"{outage.no_answer} without an answer; first: {outage.unexpected[:3]}"
        )
        assert SPOOL_LIMIT // 2 < peak <= SPOOL_LIMIT, f"spool backlog peaked at {peak} bytes"
        still = rig.send(Outcomes(), 1)
        assert still.spool_full_503 == 1, f"a full spool must refuse: {still.statuses} {still.unexpected}"

        # The database returns: the spool drains and requests are answered again.
        rig.proxy.restore()
        answered = before.ok_ids + outage.ok_ids
        drained = wait_for_ledger(rig.db, set(answered)) and wait_until(lambda: rig.backlog() == 0, 10.0)
        assert drained, (
            f"the spool did not drain within {DRAIN_TIMEOUT_S} s of the database's return "
            f"({rig.backlog()} bytes wait):\n{rig.gateway.log_tail()}"
        )
        after = Outcomes()
        assert wait_until(lambda: rig.send(after, 1).statuses[200] > 0, 20.0, interval_s=0.25), (
            f"requests are still refused after the drain: {after.statuses}\n{rig.gateway.log_tail()}"
        )
        rig.send(after, 10)
        assert after.statuses[200] == 11 and not after.unexpected, f"{after.statuses} {after.unexpected[:3]}"
        assert rig.gateway.terminate(), f"the gateway did not stop cleanly:\n{rig.gateway.log_tail()}"

        assert_exactly_once(rig.db, answered + after.ok_ids)
        assert_ledger_verifies(rig.env)
        assert_energy_conserved(rig.db)


@NEEDS_POSTGRES
def test_database_outage_longer_than_the_api_key_cache_keeps_answering_while_the_spool_has_room(
    tmp_path: Path,
) -> None:
    # A short key cache stands for any outage longer than the default 5 s; the spool is the
    # default 1 GiB, so nothing here may be refused for want of spool.
    with gateway_behind_a_proxy(tmp_path, API_KEY_CACHE_SECONDS="0.5") as rig:
        before = rig.send(Outcomes(), 3)
        assert before.statuses == {200: 3}, f"{before.statuses} {before.unexpected[:3]}"
        rig.proxy.cut()
        outage = Outcomes()
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            rig.send(outage, 1)
            time.sleep(0.1)
        assert not outage.unexpected and outage.statuses[200] > 0, (
            f"with the spool almost empty, requests during a 2 s outage were answered {dict(outage.statuses)}; "
            f"first other answer: {outage.unexpected[:1]}"
        )
        rig.proxy.restore()
        answered = before.ok_ids + outage.ok_ids
        assert wait_for_ledger(rig.db, set(answered)), "the spool did not drain after the outage"
        assert_exactly_once(rig.db, answered)


@NEEDS_POSTGRES
def test_energy_of_intervals_closed_while_the_spool_is_full_reaches_the_ledger_once_it_drains(
    tmp_path: Path,
) -> None:
    with gateway_behind_a_proxy(tmp_path, **OUTAGE_SETTINGS) as rig:
        before = rig.send(Outcomes(), 20)
        assert before.statuses == {200: 20}, f"{before.statuses} {before.unexpected[:3]}"
        rig.proxy.cut()
        outage = Outcomes()
        refused, _ = fill_the_spool(rig, outage, refusals=20)
        assert refused, f"the spool never filled: {outage.statuses}"
        time.sleep(2.5)  # the meter closes intervals about once a second: two or more while full
        rig.proxy.restore()
        answered = before.ok_ids + outage.ok_ids
        assert wait_for_ledger(rig.db, set(answered)), "the spool did not drain after the outage"
        assert wait_until(lambda: rig.backlog() == 0, 10.0), "the spool did not drain after the outage"
        after = Outcomes()
        assert wait_until(lambda: rig.send(after, 1).statuses[200] > 0, 20.0, interval_s=0.25)
        assert rig.gateway.terminate(), f"the gateway did not stop cleanly:\n{rig.gateway.log_tail()}"
        answered += after.ok_ids
        assert_exactly_once(rig.db, answered)

        # One gateway process: its intervals must tile its whole run, numbered 1..n without a gap.
        rows = rig.db.query("SELECT interval_id, t0_ns, t1_ns FROM ledger_interval")
        intervals = sorted((int(iid.rsplit(".i", 1)[1]), t0, t1) for iid, t0, t1 in rows)
        numbers = [n for n, _, _ in intervals]
        lost = sorted(set(range(1, numbers[-1] + 1)) - set(numbers))
        holes_ms = [round((b[1] - a[2]) / 1e6) for a, b in itertools.pairwise(intervals) if b[1] != a[2]]
        without_final = rig.db.requests_without_final_energy()
        without_energy = len(without_final)
        print(
            f"{len(intervals)} intervals in the ledger, numbers {lost[:20]} lost, holes of {holes_ms} ms; "
            f"{without_energy} of {len(answered)} answered requests without their final energy part"
        )
        assert not lost and not holes_ms, (
            f"intervals missing from the ledger: numbers {lost[:20]}, holes of {holes_ms} ms in the metered time"
        )
        missing = rig.db.query(
            "SELECT r.request_id, r.status, b.start_ns, b.end_ns, (SELECT MAX(t1_ns) FROM ledger_interval) "
            "FROM ledger_request r JOIN ledger_batch b ON b.batch_id = r.batch_id "
            f"WHERE r.request_id IN ({', '.join(repr(rid) for rid in without_final[:5]) or 'NULL'})"
        )
        assert without_energy == 0, (
            f"{without_energy} answered requests never got their final energy part: "
            f"(request, status, batch start, batch end, last interval end) {missing[:5]}"
        )
