"""Settings come from the environment and fail loudly, naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from carbonledger.env import database_from_url, env_bool, env_choice, env_float, env_int

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: env_int("GATEWAY_MAX_BODY_BYTES", 1, 1024, {"GATEWAY_MAX_BODY_BYTES": "big"}),
            "GATEWAY_MAX_BODY_BYTES must be an integer",
        ),
        (
            lambda: env_int("GATEWAY_MAX_BODY_BYTES", 1, 1024, {"GATEWAY_MAX_BODY_BYTES": "10"}),
            "GATEWAY_MAX_BODY_BYTES must be >= 1024",
        ),
        (
            lambda: env_float("TRITON_TIMEOUT_S", 1.0, 0.1, {"TRITON_TIMEOUT_S": "nan"}),
            "TRITON_TIMEOUT_S must be a number",
        ),
        (lambda: env_bool("DEBUG", False, {"DEBUG": "maybe"}), "DEBUG must be true or false"),
        (
            lambda: env_choice("TRITON_PROTOCOL", "http", ("http", "grpc"), {"TRITON_PROTOCOL": "ftp"}),
            "TRITON_PROTOCOL must be one of",
        ),
        (
            lambda: database_from_url("DATABASE_URL", "", {"DATABASE_URL": "mysql://x/y"}),
            "DATABASE_URL must be a sqlite:// or postgres://",
        ),
    ],
)
def test_bad_values_fail_naming_the_variable(call, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        call()


def test_embedded_defaults_need_no_environment() -> None:
    assert env_int("X", 7, environ={}) == 7
    assert env_bool("X", True, environ={}) is True
    db = database_from_url("DATABASE_URL", "sqlite:////tmp/x.sqlite3", {})
    assert db["ENGINE"] == "django.db.backends.sqlite3"
    assert "journal_mode=WAL" in db["OPTIONS"]["init_command"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("GATEWAY_MAX_BODY_BYTES", "lots", "GATEWAY_MAX_BODY_BYTES must be an integer, got 'lots'"),
        ("CARBON_FORECAST_REFRESH_S", "0", "CARBON_FORECAST_REFRESH_S must be a number >= 1.0, got '0'"),
        ("LEDGER_PREPARE_PROCESS", "maybe", "LEDGER_PREPARE_PROCESS must be true or false"),
        ("DEVICE_IDLE_CARRY_S", "-1", "DEVICE_IDLE_CARRY_S must be a number >= 0.0, got '-1'"),
        ("DEVICE_IDLE_CARRY_S", "inf", "DEVICE_IDLE_CARRY_S must be a number <= 60.0, got 'inf'"),
    ],
)
def test_start_up_stops_on_a_bad_variable_with_its_name(
    tmp_path: Path, name: str, value: str, message: str
) -> None:
    env = {**os.environ, name: value, "CARBONLEDGER_VAR_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0
    assert message in proc.stderr
