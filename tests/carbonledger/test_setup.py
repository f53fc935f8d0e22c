"""`manage.py setup` (migrate, the shipped factors, optional demo data) is safe to run from several replicas at
once, and the demo API key is made once and reused.

Replicas starting together on an empty PostgreSQL database used to race in `migrate` (UniqueViolation on
django_migrations, or "relation already exists") and in `bootstrap_demo` (IntegrityError); the set-up now runs
under a database advisory lock."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import re
import sqlite3
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from tenancy.models import ApiKey
from tenancy.selectors import api_key_lookup
from tenancy.services import api_key_revoke
from tests.factories import LedgerRequestFactory, OrganizationFactory
from tests.support.gateway_process import (
    PYTHON,
    REPO_ROOT,
    gateway_env,
    manage,
    postgres_url_from_env,
    wait_until,
)

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
    # One of the two loaded the synthetic month, the other found it there.
    loaded = [re.search(r"demo data\b.*?(\d+) (?:synthetic )?requests", out) for _rc, out in results]
    assert sum(m is not None for m in loaded) == 1, [out[-1500:] for _rc, out in results]
    requests = _query(
        database_url,
        "SELECT count(*) FROM ledger_request r JOIN carbonledger_organization o ON o.id = r.organization_id"
        " WHERE o.slug = 'demo'",
    )
    assert requests == [(next(int(m.group(1)) for m in loaded if m),)]
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


def _bootstrap_demo() -> str:
    out = io.StringIO()
    call_command("bootstrap_demo", stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.fixture
def demo_var(tmp_path: Path, settings: Any) -> Path:
    """A var folder, and a demo organization whose synthetic month is in already (these tests are about the
    key; the concurrent ones above load the month)."""
    settings.VAR_DIR = tmp_path / "var"
    settings.MODEL_REPOSITORY = tmp_path / "var" / "models"
    LedgerRequestFactory(organization=OrganizationFactory(slug="demo"))
    return tmp_path / "var"


def _live_demo_keys() -> set[str]:
    return set(
        ApiKey.objects.filter(
            organization__slug="demo", revoked_at__isnull=True, scopes__contains="admin"
        ).values_list("prefix", flat=True)
    )


@pytest.mark.django_db
def test_four_starts_keep_one_live_demo_key_in_a_private_file(demo_var: Path) -> None:
    key_file = demo_var / "demo-api-key"
    keys = []
    for _start in range(4):
        out = _bootstrap_demo()
        keys.append(key_file.read_text().strip())
        assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
        assert keys[-1] in out  # the README's first request names it
    assert len(set(keys)) == 1, "a start made another demo key"
    assert _live_demo_keys() == {keys[0].split("_")[1]}
    found = api_key_lookup(keys[0])
    assert found is not None and found.organization.slug == "demo"


@pytest.mark.django_db
def test_a_demo_key_whose_file_is_gone_or_revoked_is_replaced(demo_var: Path) -> None:
    key_file = demo_var / "demo-api-key"
    _bootstrap_demo()
    first = key_file.read_text().strip()
    api_key_revoke(api_key=ApiKey.objects.get(prefix=first.split("_")[1]))
    _bootstrap_demo()
    second = key_file.read_text().strip()
    assert second != first
    assert _live_demo_keys() == {second.split("_")[1]}
    key_file.unlink()
    _bootstrap_demo()
    third = key_file.read_text().strip()
    assert third not in (first, second)
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert api_key_lookup(third) is not None


@contextlib.contextmanager
def _holding_the_setup_lock(database_url: str) -> Iterator[None]:
    """The set-up lock, held by this test as another replica would hold it."""
    if database_url.startswith("sqlite:///"):
        path = Path(database_url[len("sqlite:///") :])
        fd = os.open(path.with_name(f"{path.name}.setup.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
        return
    import psycopg

    from tenancy.locks import _NAMESPACE, KEYS

    url = "postgresql" + database_url[database_url.index(":") :]
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", ((_NAMESPACE << 32) | KEYS["setup"],))
        yield


def test_a_setup_waits_for_the_lock_another_process_holds_and_says_so(
    tmp_path: Path, database_url: str
) -> None:
    env = gateway_env(tmp_path / "var", database_url)
    log_path = tmp_path / "setup.log"
    with _holding_the_setup_lock(database_url), open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [PYTHON, "manage.py", "setup"], cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            assert wait_until(lambda: "waiting for the setup lock" in log_path.read_text(), 120), (
                log_path.read_text()[-2000:]
            )
            time.sleep(1.0)
            assert proc.poll() is None, "setup went on without the lock"
            assert "Applying" not in log_path.read_text()
        except BaseException:
            proc.kill()
            raise
    assert proc.wait(300) == 0, log_path.read_text()[-3000:]
    assert "set-up done" in log_path.read_text()
    _assert_schema_complete(env)
