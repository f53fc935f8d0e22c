"""Chain ownership with real gateway processes (issue 23): a spool folder copied into a second replica (same
``chain_id`` file) is caught, not trusted. ``manage.py serve`` runs on its own database (a SQLite file, or a fresh
PostgreSQL database in the suite's PostgreSQL run), never pytest-django's, with a short chain lease.

* A second gateway started on a copy of a running gateway's spool refuses to start with one line naming the
  chain and its holder, while the first keeps serving and draining every answered request exactly once; a
  ``drain_ledger`` on the copy is refused the same way.
* A gateway killed outright and started again on its own spool takes its chain back once the lease expires.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shutil
import signal
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import psycopg
import pytest

from tests.support.gateway_process import (
    GatewayProcess,
    LedgerDatabase,
    LoadClients,
    gateway_env,
    infer_once,
    manage,
    prepare_gateway,
    wait_until,
)

# Subprocesses on their own databases: pytest-django's test database is never touched.
pytestmark = pytest.mark.django_db(False)

# Short, for the test's sake; long enough that a loaded machine does not starve a renewal (every TTL_S / 3).
TTL_S = 5.0
EXIT_CHAIN_HELD = 75  # ledger.ownership.EXIT_CHAIN_HELD, without importing Django code into the test process


def _ledger_db(database_url: str) -> LedgerDatabase:
    if database_url.startswith("sqlite:///"):
        return LedgerDatabase(sqlite_path=Path(database_url.removeprefix("sqlite:///")))
    return LedgerDatabase(postgres_url=database_url)


def _env(var_dir: Path, database_url: str) -> dict[str, str]:
    return gateway_env(
        var_dir, database_url, LEDGER_CHAIN_LEASE_TTL_S=str(TTL_S), LEDGER_WRITE_INTERVAL_S="0.1"
    )


def _lease(db: LedgerDatabase, chain_id: str) -> tuple[str, int]:
    rows = db.query(f"SELECT owner, token FROM tenancy_lease WHERE name = 'chain:{chain_id}'")
    assert len(rows) == 1, rows
    return str(rows[0][0]), int(rows[0][1])


def _served(address: tuple[str, int], key: str, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        status, body = infer_once(address, key)
        assert status == 200, body
        ids.append(orjson.loads(body)["parameters"]["ledger_id"])
    return ids


def _set_lease(database_url: str, chain_id: str, seconds: float, new_owner: str | None = None) -> None:
    """Set the chain's lease to run ``seconds`` from now; with ``new_owner``, as that owner's, the token one up
    (another process that took the chain over)."""
    name = f"chain:{chain_id}"
    owner_sql = ", owner = %s, token = token + 1" if new_owner is not None else ""
    if database_url.startswith("sqlite:///"):
        until = (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M:%S.%f")
        params = (until, new_owner, name) if new_owner is not None else (until, name)
        conn = sqlite3.connect(database_url.removeprefix("sqlite:///"), timeout=20)
        try:
            sql = f"UPDATE tenancy_lease SET expires_at = %s{owner_sql} WHERE name = %s".replace("%s", "?")
            conn.execute(sql, params)
            conn.commit()
        finally:
            conn.close()
        return
    with psycopg.connect("postgresql" + database_url[database_url.index(":") :], autocommit=True) as conn:
        conn.execute(
            f"UPDATE tenancy_lease SET expires_at = clock_timestamp() + make_interval(secs => %s){owner_sql} "
            "WHERE name = %s",
            (seconds, new_owner, name) if new_owner is not None else (seconds, name),
        )


def _metric(address: tuple[str, int], name: str) -> int | None:
    conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
    finally:
        conn.close()
    match = re.search(rf"^{name}{{[^}}]*}} (\d+)$", body, re.MULTILINE)
    return int(match[1]) if match else None


def _drainer_pids(gateway_pid: int) -> list[int]:
    """The drain_ledger processes a gateway started (in sessions of their own, so not in its process group)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"drain_ledger" in argv and str(gateway_pid).encode() in argv:
                pids.append(int(entry.name))
    return pids


def _all_once(db: LedgerDatabase, ids: list[str]) -> bool:
    counts = db.request_id_counts()
    return all(counts[i] == 1 for i in ids)


def test_a_gateway_on_a_copy_of_a_running_gateways_spool_refuses_to_start_while_the_first_serves_and_drains(
    tmp_path: Path, database_url: str
) -> None:
    db = _ledger_db(database_url)
    var_a, var_b = tmp_path / "a", tmp_path / "b"
    env_a = _env(var_a, database_url)
    key = prepare_gateway(env_a)
    with GatewayProcess(env_a, tmp_path / "a.log") as first:
        first.start()
        before = _served(first.address, key, 5)
        assert wait_until(lambda: _all_once(db, before), 20), first.log_tail()
        chain_id = (var_a / "spool" / "chain_id").read_text().strip()
        holder, token = _lease(db, chain_id)

        # The copy: an image or volume made from the running replica's var folder.
        shutil.copytree(var_a / "spool", var_b / "spool")
        shutil.copytree(var_a / "models", var_b / "models")
        env_b = _env(var_b, database_url)
        clients = LoadClients(first.address, key, threads=2, max_seconds=60).start()
        try:
            started = time.monotonic()
            with GatewayProcess(env_b, tmp_path / "b.log") as second, pytest.raises(RuntimeError) as refused:
                second.start(timeout_s=60)
            waited = time.monotonic() - started
            drained = manage(env_b, "drain_ledger", "--spool", str(var_b / "spool"), "--once")
        finally:
            outcomes = clients.stop()

        # One line that says which chain and who holds it.
        lines = [line for line in str(refused.value).splitlines() if chain_id in line and holder in line]
        assert lines, str(refused.value)
        assert "exited during start-up" in str(refused.value)
        assert waited < 30
        assert drained.returncode == EXIT_CHAIN_HELD, drained.stdout + drained.stderr
        assert re.search(rf"{chain_id}.*{re.escape(holder)}", drained.stderr), drained.stderr

        # The first replica served throughout, still holds its chain, and drains what it answered.
        assert outcomes.snapshot()[0] > 0 and not outcomes.unexpected and outcomes.no_answer == 0
        after = _served(first.address, key, 3)
        answered = before + outcomes.ok_ids + after
        assert wait_until(lambda: _all_once(db, answered), 30), first.log_tail()
        assert _lease(db, chain_id) == (holder, token)
        assert _metric(first.address, "carbonledger_ledger_chain_lease_held") == 1
        assert first.terminate(), first.log_tail()

    assert db.query(f"SELECT COUNT(*) FROM carbonledger_ledgerchain WHERE chain_id = '{chain_id}'") == [(1,)]
    verified = manage(env_a, "verify_ledger")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_gateway_killed_and_started_again_on_its_own_spool_takes_its_chain_back_once_the_lease_expires(
    tmp_path: Path, database_url: str
) -> None:
    db = _ledger_db(database_url)
    var_dir = tmp_path / "var"
    env = _env(var_dir, database_url)
    key = prepare_gateway(env)
    with GatewayProcess(env, tmp_path / "first.log") as first:
        first.start()
        before = _served(first.address, key, 5)
        chain_id = (var_dir / "spool" / "chain_id").read_text().strip()
        holder, token = _lease(db, chain_id)
        assert first.proc is not None
        drainers = _drainer_pids(first.proc.pid)
        assert len(drainers) == 1, drainers
        # SIGKILL, the drainer too (a container killed whole): nothing releases the lease, which must expire.
        os.kill(drainers[0], signal.SIGKILL)
        first.kill()
    # As if the last renewal came just before the kill, with a longer lease than the start-up of the next
    # process takes on a loaded machine; that one waits up to its own lease time (30 s) for it.
    _set_lease(database_url, chain_id, 20.0)
    killed = time.monotonic()

    with GatewayProcess({**env, "LEDGER_CHAIN_LEASE_TTL_S": "30"}, tmp_path / "second.log") as second:
        second.start(timeout_s=60)
        owner, new_token = _lease(db, chain_id)
        assert owner != holder and new_token == token + 1
        assert "waiting for that lease to expire" in (tmp_path / "second.log").read_text()
        assert time.monotonic() - killed > 19  # it waited for the lease, and did not take it live
        after = _served(second.address, key, 5)
        assert wait_until(lambda: _all_once(db, before + after), 30), second.log_tail()
        assert second.terminate(), second.log_tail()

    verified = manage(env, "verify_ledger")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_gateway_whose_chain_is_taken_over_keeps_serving_but_writes_nothing_and_shows_it(
    tmp_path: Path, database_url: str
) -> None:
    db = _ledger_db(database_url)
    var_dir = tmp_path / "var"
    env = _env(var_dir, database_url)
    key = prepare_gateway(env)
    with GatewayProcess(env, tmp_path / "gateway.log") as gateway:
        gateway.start()
        before = _served(gateway.address, key, 3)
        assert wait_until(lambda: _all_once(db, before), 20), gateway.log_tail()
        chain_id = (var_dir / "spool" / "chain_id").read_text().strip()
        assert _metric(gateway.address, "carbonledger_ledger_chain_lease_held") == 1

        # Another process took the chain over (this one stalled past its lease, say).
        _set_lease(database_url, chain_id, 600.0, new_owner="replica-b:4242:0123456789ab")
        after = _served(gateway.address, key, 3)  # still answered: the spool keeps them

        assert wait_until(
            lambda: _metric(gateway.address, "carbonledger_ledger_chain_lease_held") == 0, 20
        ), gateway.log_tail()
        time.sleep(2 * TTL_S)  # time enough for a drainer that still wrote to write them
        counts = db.request_id_counts()
        assert not any(counts[i] for i in after), "a fenced gateway wrote to a chain it no longer holds"
        assert all(counts[i] == 1 for i in before)
        log = (tmp_path / "gateway.log").read_text()
        assert "replica-b:4242:0123456789ab" in log and "ledger writer stopped" in log, gateway.log_tail()
        assert "not restarted" in log
        assert _lease(db, chain_id) == ("replica-b:4242:0123456789ab", 2)
        gateway.terminate()

    verified = manage(env, "verify_ledger")
    assert verified.returncode == 0, verified.stdout + verified.stderr
