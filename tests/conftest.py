"""Fixtures shared by test packages."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from tests.support.gateway_process import fresh_postgres_database, postgres_url_from_env

# Gateways started by the tests (in this process, or as processes inheriting this environment) listen for gRPC
# only where a test asks for it on a free port: test runs share machines, and the default port (8001) would
# collide. Django's settings are loaded before this file, hence both.
os.environ["CARBONLEDGER_GRPC_PORT"] = "0"
settings.GRPC_PORT = 0


@pytest.fixture
def database_url(tmp_path: Path) -> Iterator[str]:
    """For end-to-end tests with a real server and worker: a fresh PostgreSQL database when the suite runs on
    PostgreSQL, else an SQLite file."""
    admin = postgres_url_from_env()
    if admin is None:
        yield f"sqlite:///{tmp_path / 'e2e.sqlite3'}"
    else:
        with fresh_postgres_database(admin) as url:
            yield url
