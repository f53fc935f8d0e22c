"""JSON nested deeper than the management API accepts is a 400 naming the problem, on every endpoint that
reads a JSON body, and the server answers the next request as usual."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.parsers import JSONParser
from rest_framework.settings import api_settings
from rest_framework.test import APIClient

from carbon import services as carbon
from tenancy.models import Organization
from tenancy.services import api_key_create
from tests.factories import OrganizationFactory
from tests.support.models import DEMO

pytestmark = pytest.mark.django_db

API = "/api/v1"
DEEP = 50_000


def _deep_list(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _deep_object(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


@pytest.fixture
def org() -> Organization:
    carbon.load_shipped_factors()
    return OrganizationFactory()


def _client(org: Organization, scopes: str = "infer,read,admin") -> APIClient:
    client = APIClient(raise_request_exception=False)  # a crash shows as a 500, not as an exception here
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_create(organization=org, scopes=scopes).raw_key}")
    return client


def _json_routes(org: Organization) -> list[tuple[str, str]]:
    site = carbon.site_create(name="deep-site", zone="FR", organization=org)
    return [
        ("post", f"{API}/api-keys"),
        ("post", f"{API}/instruments"),
        ("post", f"{API}/residual-mixes"),
        ("post", f"{API}/sites"),
        ("post", f"{API}/sites/{site.pk}/pue"),
        ("put", f"{API}/sites/{site.pk}/carbon-aware"),
        ("post", f"{API}/reports"),
    ]


@pytest.mark.parametrize("body", [_deep_list(DEEP), _deep_object(DEEP)], ids=["arrays", "objects"])
def test_deeply_nested_json_is_a_400_naming_the_nesting_on_every_json_endpoint(
    org: Organization, body: bytes
) -> None:
    client = _client(org)
    for method, path in _json_routes(org):
        response = getattr(client, method)(path, body, content_type="application/json")
        assert response.status_code == 400, (path, response.status_code)
        assert "nested" in str(response.json()).lower(), (path, response.json())
    # The server keeps answering: a good request right after is served.
    good = client.post(f"{API}/api-keys", {"scopes": ["read"]}, format="json")
    assert good.status_code == 201, good.json()


def test_json_nested_within_the_limit_is_parsed_as_before(org: Organization) -> None:
    client = _client(org)
    response = client.post(
        f"{API}/api-keys", b'{"scopes": ["read"], "name": "shallow"}', content_type="application/json"
    )
    assert response.status_code == 201
    # A few levels more than any field needs: refused by the serializer, by field, not by the parser.
    nested = client.post(f"{API}/api-keys", b'{"scopes": [[["read"]]]}', content_type="application/json")
    assert nested.status_code == 400 and "scopes" in nested.json()


def test_every_json_parser_the_api_uses_is_the_depth_bounded_one() -> None:
    """Views that name their parsers and the default for those that do not: none reaches DRF's unbounded
    JSONParser, so a new view cannot bring the RecursionError back."""

    def views(patterns: list[Any]) -> list[Any]:
        found = []
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                found.extend(views(pattern.url_patterns))
            elif isinstance(pattern, URLPattern):
                found.append(pattern.callback)
        return found

    parsers = set(api_settings.DEFAULT_PARSER_CLASSES)
    for callback in views(get_resolver().url_patterns):
        view_class = getattr(callback, "cls", None)
        if view_class is not None:
            parsers.update(getattr(view_class, "parser_classes", ()))
    json_parsers = {p for p in parsers if issubclass(p, JSONParser)}
    assert json_parsers, "no JSON parser found: the test looks in the wrong place"
    assert JSONParser not in json_parsers
    for parser in json_parsers:
        assert getattr(parser, "max_depth", 0) > 0, parser


def test_a_job_file_line_nested_too_deep_is_refused_with_its_line(org: Organization, settings: Any) -> None:
    settings.MODEL_REPOSITORY = DEMO
    client = _client(org)
    deadline = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    line = b'{"inputs": ' + _deep_list(DEEP) + b"}\n"
    response = client.post(
        f"{API}/jobs",
        {"file": SimpleUploadedFile("job.jsonl", line), "model": "linear", "deadline": deadline},
        format="multipart",
    )
    assert response.status_code == 400, response.content[:300]
    assert "line 1" in response.json()["error"]
