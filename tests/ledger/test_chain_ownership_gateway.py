"""Chain ownership with real gateway processes (issue 23): a spool folder copied into a second replica (same
``chain_id`` file) is caught, not trusted. ``manage.py serve`` runs on its own database (a SQLite file, or a fresh
PostgreSQL database in the suite's PostgreSQL run), never pytest-django's, with a short chain lease.

* A second gateway started on a copy of a running gateway's spool refuses to start with one line naming the
  chain and its holder, while the first keeps serving and draining every answered request exactly once; a
  ``drain_ledger`` on the copy is refused the same way.
* A gateway killed outright and started again on its own spool takes its chain back once the lease expires.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import orjson
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

TTL_S = 2.0
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
        first.kill()  # SIGKILL: the lease is not released

    with GatewayProcess(env, tmp_path / "second.log") as second:
        second.start(timeout_s=60)
        owner, new_token = _lease(db, chain_id)
        assert owner != holder and new_token == token + 1
        after = _served(second.address, key, 5)
        assert wait_until(lambda: _all_once(db, before + after), 30), second.log_tail()
        assert second.terminate(), second.log_tail()

    verified = manage(env, "verify_ledger")
    assert verified.returncode == 0, verified.stdout + verified.stderr
