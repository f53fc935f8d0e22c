"""`manage.py setup` (migrate, the shipped factors, optional demo data) is safe to run from several replicas at
once, and the demo API key is made once and reused.

Replicas starting together on an empty PostgreSQL database used to race in `migrate` (UniqueViolation on
django_migrations, or "relation already exists") and in `bootstrap_demo` (IntegrityError); the set-up now runs
under a database advisory lock."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.gateway_process import PYTHON, REPO_ROOT, gateway_env, manage, postgres_url_from_env

postgres_only = pytest.mark.skipif(
    postgres_url_from_env() is None, reason="the start-up races are PostgreSQL races (set DATABASE_URL)"
)


def _query(database_url: str, sql: str) -> list[tuple[Any, ...]]:
    if database_url.startswith("sqlite:///"):
        conn = sqlite3.connect(database_url[len("sqlite:///") :], timeout=20)
        try:
            return list(conn.execute(sql).fetchall())
        finally:
            conn.close()
    import psycopg

    url = "postgresql" + database_url[database_url.index(":") :]
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        return list(conn.execute(sql).fetchall())


def _together(envs: list[dict[str, str]], *args: str, timeout_s: float = 300.0) -> list[tuple[int, str]]:
    """``manage.py args`` in one process per environment, all started at once; (exit code, output) of each."""
    procs = [
        subprocess.Popen(
            [PYTHON, "manage.py", *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for env in envs
    ]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=timeout_s)
        results.append((proc.returncode, out))
    return results


def _replica_envs(tmp_path: Path, database_url: str, n: int = 2) -> list[dict[str, str]]:
    return [gateway_env(tmp_path / f"replica-{i}", database_url) for i in range(n)]


def _assert_schema_complete(env: dict[str, str]) -> None:
    done = manage(env, "migrate", "--check", "--noinput")
    assert done.returncode == 0, f"migrations left unapplied:\n{done.stdout}\n{done.stderr}"


@postgres_only
def test_two_setups_started_together_on_an_empty_database_both_succeed(
    tmp_path: Path, database_url: str
) -> None:
    envs = _replica_envs(tmp_path, database_url)
    results = _together(envs, "setup")
    for rc, out in results:
        assert rc == 0, out[-3000:]
    _assert_schema_complete(envs[0])
    # The shipped factors were imported once, not once per replica.
    imports = _query(
        database_url, "SELECT checksum_sha256, count(*) FROM carbonledger_factorimport GROUP BY 1"
    )
    assert imports and all(n == 1 for _checksum, n in imports), imports


@postgres_only
def test_two_demo_setups_started_together_both_succeed_and_load_the_demo_once(
    tmp_path: Path, database_url: str
) -> None:
    envs = _replica_envs(tmp_path, database_url)
    done = manage(envs[0], "migrate", "--noinput")
    assert done.returncode == 0, done.stderr[-3000:]
    results = _together(envs, "bootstrap_demo")
    for rc, out in results:
        assert rc == 0, out[-3000:]
    assert _query(database_url, "SELECT count(*) FROM carbonledger_organization WHERE slug = 'demo'") == [
        (1,)
    ]
    assert _query(database_url, "SELECT count(*) FROM auth_user WHERE username = 'demo'") == [(1,)]
    requests = _query(
        database_url,
        "SELECT count(*) FROM ledger_request r JOIN carbonledger_organization o ON o.id = r.organization_id"
        " WHERE o.slug = 'demo'",
    )
    assert requests == [(50_000,)], "the synthetic month was loaded more than once"
    # Each replica keeps a working key of its own in its var folder.
    for env in envs:
        key = (Path(env["CARBONLEDGER_VAR_DIR"]) / "demo-api-key").read_text().strip()
        assert _live_demo_key_prefixes(database_url) >= {key.split("_")[1]}


@postgres_only
def test_setup_with_demo_from_two_replicas_at_once_succeeds(tmp_path: Path, database_url: str) -> None:
    envs = _replica_envs(tmp_path, database_url)
    results = _together(envs, "setup", "--demo")
    for rc, out in results:
        assert rc == 0, out[-3000:]
    _assert_schema_complete(envs[0])
    assert _query(database_url, "SELECT count(*) FROM auth_user WHERE username = 'demo'") == [(1,)]


def _live_demo_key_prefixes(database_url: str) -> set[str]:
    rows = _query(
        database_url,
        "SELECT k.prefix FROM carbonledger_apikey k JOIN carbonledger_organization o ON o.id = k.organization_id"
        " WHERE o.slug = 'demo' AND k.revoked_at IS NULL AND k.scopes LIKE '%admin%'",
    )
    return {prefix for (prefix,) in rows}


def test_four_starts_keep_one_live_demo_key_in_a_private_file(tmp_path: Path, database_url: str) -> None:
    env = gateway_env(tmp_path / "var", database_url)
    done = manage(env, "migrate", "--noinput")
    assert done.returncode == 0, done.stderr[-3000:]
    key_file = tmp_path / "var" / "demo-api-key"
    keys = []
    for _start in range(4):
        done = manage(env, "bootstrap_demo")
        assert done.returncode == 0, done.stderr[-3000:]
        keys.append(key_file.read_text().strip())
        assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert len(set(keys)) == 1, "a start made another demo key"
    assert _live_demo_key_prefixes(database_url) == {keys[0].split("_")[1]}
    # The kept key is the one the later starts name, and it still authenticates.
    assert keys[0] in done.stdout
    check = manage(
        env, "shell", "-c", f"from tenancy.selectors import api_key_lookup as f; print(f({keys[0]!r}))"
    )
    assert check.returncode == 0 and "demo:" in check.stdout, check.stdout + check.stderr


def test_a_demo_key_whose_file_is_gone_or_revoked_is_replaced(tmp_path: Path, database_url: str) -> None:
    env = gateway_env(tmp_path / "var", database_url)
    assert manage(env, "migrate", "--noinput").returncode == 0
    key_file = tmp_path / "var" / "demo-api-key"
    assert manage(env, "bootstrap_demo").returncode == 0
    first = key_file.read_text().strip()
    done = manage(env, "revoke_api_key", first.split("_")[1])
    assert done.returncode == 0, done.stderr
    assert manage(env, "bootstrap_demo").returncode == 0
    second = key_file.read_text().strip()
    assert second != first
    assert _live_demo_key_prefixes(database_url) == {second.split("_")[1]}
