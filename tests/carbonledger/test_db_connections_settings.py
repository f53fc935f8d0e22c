"""The database settings: no persistent connections, the pool only when CARBONLEDGER_DB_POOL_MAX_SIZE asks for
one, bad values stop start-up naming the variable, and every connection says which process holds it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from carbonledger.env import database_from_url, process_label

ROOT = Path(__file__).resolve().parents[2]
PG = "postgres://carbon@db.internal:5432/ledger"


def _config(**environ: str) -> dict[str, object]:
    return database_from_url("DATABASE_URL", "", environ={"DATABASE_URL": PG, **environ})


def test_no_connection_is_persistent_and_there_is_no_pool_by_default() -> None:
    config = _config()
    assert config["CONN_MAX_AGE"] == 0
    options = config["OPTIONS"]
    assert isinstance(options, dict)
    assert "pool" not in options
    assert _config(CARBONLEDGER_DB_POOL_MAX_SIZE="0")["OPTIONS"] == options


def test_the_pool_is_bounded_by_its_setting() -> None:
    config = _config(CARBONLEDGER_DB_POOL_MAX_SIZE="6", CARBONLEDGER_DB_POOL_TIMEOUT_S="2.5")
    assert config["CONN_MAX_AGE"] == 0  # Django's pool refuses persistent connections
    options = config["OPTIONS"]
    assert isinstance(options, dict)
    assert options["pool"] == {"min_size": 0, "max_size": 6, "timeout": 2.5}
    assert config["CONN_HEALTH_CHECKS"] is True


def test_sqlite_takes_no_pool() -> None:
    config = database_from_url(
        "DATABASE_URL",
        "",
        environ={"DATABASE_URL": "sqlite:////tmp/x.sqlite3", "CARBONLEDGER_DB_POOL_MAX_SIZE": "4"},
    )
    options = config["OPTIONS"]
    assert isinstance(options, dict)
    assert "pool" not in options and config["CONN_MAX_AGE"] == 0


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("CARBONLEDGER_DB_POOL_MAX_SIZE", "-1", "CARBONLEDGER_DB_POOL_MAX_SIZE must be >= 0"),
        ("CARBONLEDGER_DB_POOL_MAX_SIZE", "lots", "CARBONLEDGER_DB_POOL_MAX_SIZE must be an integer"),
        ("CARBONLEDGER_DB_POOL_MAX_SIZE", "100000", "CARBONLEDGER_DB_POOL_MAX_SIZE must be <= 1000"),
        ("CARBONLEDGER_DB_POOL_TIMEOUT_S", "0", "CARBONLEDGER_DB_POOL_TIMEOUT_S must be a number >= 0.1"),
    ],
)
def test_a_bad_pool_setting_fails_naming_the_variable(variable: str, value: str, message: str) -> None:
    environ = {"CARBONLEDGER_DB_POOL_MAX_SIZE": "4", variable: value}
    with pytest.raises(ImproperlyConfigured, match=message):
        _config(**environ)


def test_start_up_stops_on_a_bad_pool_size_naming_it(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "CARBONLEDGER_VAR_DIR": str(tmp_path),
        "DATABASE_URL": PG,
        "CARBONLEDGER_DB_POOL_MAX_SIZE": "-3",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "CARBONLEDGER_DB_POOL_MAX_SIZE must be >= 0" in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize(
    ("argv", "label"),
    [
        (["manage.py", "serve", "--role", "web"], "carbonledger serve"),
        (["/srv/app/manage.py", "drain_ledger", "--spool", "/x"], "carbonledger drain_ledger"),
        (
            ["/venv/bin/celery", "-A", "carbonledger", "worker", "--pool=threads"],
            "carbonledger celery worker",
        ),
        (
            ["/venv/lib/python3.11/site-packages/celery/__main__.py", "-A", "carbonledger", "beat"],
            "carbonledger celery beat",
        ),
        (["manage.py"], "carbonledger"),
        ([], "carbonledger"),
    ],
)
def test_each_process_names_itself_to_the_database(argv: list[str], label: str) -> None:
    assert process_label(argv) == label
    assert _config()["OPTIONS"]["application_name"] == process_label()  # type: ignore[index]
