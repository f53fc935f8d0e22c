"""Fixtures shared by test packages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway_process import fresh_postgres_database, postgres_url_from_env


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
