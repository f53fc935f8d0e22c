"""The OpenAPI 3 schema (drf-spectacular), its documentation page, and a schemathesis run against the
schema, authenticated, that must find no server error on any operation."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error

from carbon.rollups import rollups_update
from carbon.services import load_shipped_factors
from demo.synthetic_ledger import generate_ledger
from tenancy.services import api_key_create
from tests.factories import OrganizationFactory

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application())


@pytest.fixture
def keep_test_connection() -> Iterator[None]:
    """The raw WSGI handler closes "old" connections around each request, and inside the test's transaction
    that closes the PostgreSQL connection (SQLite's in-memory one survives). Django's test client unhooks the
    same two receivers for the same reason."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def auth(db: None, keep_test_connection: None) -> dict[str, str]:
    load_shipped_factors()
    org = OrganizationFactory()
    generate_ledger(organization=org, requests=300, days=2, end=datetime(2025, 3, 1, tzinfo=UTC))
    rollups_update()
    key = api_key_create(organization=org, scopes="infer,read,admin")
    return {"Authorization": f"Bearer {key.raw_key}"}


@schema.parametrize()
@hypothesis_settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_operation_answers_with_a_server_error(case: schemathesis.Case, auth: dict[str, str]) -> None:
    case.call_and_validate(headers=auth, checks=[not_a_server_error])


def test_the_schema_is_openapi_3_and_names_the_bearer_key_scheme(client) -> None:
    body = client.get("/api/schema/?format=json").json()
    assert body["openapi"].startswith("3.")
    assert body["components"]["securitySchemes"]["ApiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "an API key: cl_<prefix>_<secret>",
    }
    paths = set(body["paths"])
    for expected in ("/api/v1/ledger/requests", "/api/v1/factor-imports", "/api/v1/reports/{id}/files/{fmt}"):
        assert expected in paths


def test_the_documentation_page_and_its_assets_are_served_without_a_cdn(client) -> None:
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "swagger-ui" in html and "cdn." not in html
    asset = client.get("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")
    assert asset.status_code == 200
    assert client.get("/static/../settings.py").status_code == 404
