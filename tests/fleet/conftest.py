"""A fresh PostgreSQL database for each fleet test (its processes share it, as replicas share one)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.gateway_process import fresh_postgres_database, postgres_url_from_env


@pytest.fixture
def fleet_database() -> Iterator[str]:
    url = postgres_url_from_env()
    if url is None:
        pytest.skip("the fleet tests need PostgreSQL (DATABASE_URL=postgres://...)")
    with fresh_postgres_database(url) as fresh:
        yield fresh
