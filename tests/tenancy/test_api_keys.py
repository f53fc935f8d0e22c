from __future__ import annotations

import hashlib
import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from tenancy import selectors
from tenancy.models import ApiKey
from tenancy.services import ServiceError, api_key_create, api_key_revoke, parse_scopes
from tests.factories import OrganizationFactory

pytestmark = pytest.mark.django_db


def test_key_is_shown_once_and_only_its_hash_is_stored() -> None:
    org = OrganizationFactory()
    created = api_key_create(organization=org, scopes="infer,read")
    row = ApiKey.objects.get(pk=created.api_key.pk)
    assert row.key_sha256 == hashlib.sha256(created.raw_key.encode()).hexdigest()
    stored = " ".join(str(getattr(row, f.attname)) for f in ApiKey._meta.concrete_fields)
    assert created.raw_key not in stored
    assert created.raw_key.startswith(f"cl_{row.prefix}_")


def test_two_keys_are_different_random_tokens() -> None:
    org = OrganizationFactory()
    a = api_key_create(organization=org, scopes="infer")
    b = api_key_create(organization=org, scopes="infer")
    assert a.raw_key != b.raw_key and a.api_key.prefix != b.api_key.prefix


def test_lookup_finds_the_key_and_its_organization_and_scopes() -> None:
    org = OrganizationFactory()
    created = api_key_create(organization=org, scopes=["read", "infer"])
    key = selectors.api_key_lookup(created.raw_key)
    assert key is not None and key.organization == org
    assert key.scope_set == frozenset({"infer", "read"})


def test_lookup_rejects_wrong_secret_malformed_and_revoked_keys() -> None:
    org = OrganizationFactory()
    created = api_key_create(organization=org, scopes="infer")
    assert (
        selectors.api_key_lookup(created.raw_key[:-1] + ("A" if created.raw_key[-1] != "A" else "B")) is None
    )
    assert selectors.api_key_lookup("garbage") is None
    assert selectors.api_key_lookup("cl_nope_nope") is None
    api_key_revoke(api_key=created.api_key)
    assert selectors.api_key_lookup(created.raw_key) is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [("", "at least one scope"), ("infer,fly", "unknown scope(s) fly"), (" , ", "at least one scope")],
)
def test_bad_scopes_are_refused_with_the_reason(raw: str, message: str) -> None:
    with pytest.raises(ServiceError, match=re.escape(message)):
        parse_scopes(raw)


def test_create_api_key_command_prints_the_key_on_its_last_line() -> None:
    org = OrganizationFactory(slug="acme")
    out = StringIO()
    call_command("create_api_key", "acme", "--scopes", "infer,read", stdout=out, stderr=StringIO())
    raw = out.getvalue().strip().splitlines()[-1]
    key = selectors.api_key_lookup(raw)
    assert key is not None and key.organization == org and key.scope_set == {"infer", "read"}


def test_create_api_key_command_names_an_unknown_organization() -> None:
    with pytest.raises(CommandError, match="no organization with the slug 'ghost'"):
        call_command("create_api_key", "ghost", stdout=StringIO(), stderr=StringIO())


def test_revoke_api_key_command_revokes_by_prefix() -> None:
    created = api_key_create(organization=OrganizationFactory(), scopes="infer")
    call_command("revoke_api_key", created.api_key.prefix, stdout=StringIO())
    assert selectors.api_key_lookup(created.raw_key) is None


def test_bootstrap_demo_creates_the_demo_org_models_and_a_key(tmp_path, settings) -> None:
    settings.MODEL_REPOSITORY = tmp_path / "models"
    settings.VAR_DIR = tmp_path  # where the demo key is kept
    out = StringIO()
    call_command("bootstrap_demo", stdout=out)
    raw = out.getvalue().strip().splitlines()[-1].rsplit(" ", 1)[-1]
    key = selectors.api_key_lookup(raw)
    assert key is not None and key.organization.slug == "demo"
    assert {p.name for p in settings.MODEL_REPOSITORY.iterdir()} >= {"digits", "digits_int8", "linear"}
    call_command("bootstrap_demo", stdout=StringIO())  # twice is fine: one org, the same key
    assert ApiKey.objects.filter(organization__slug="demo").count() == 1


def test_rest_api_authenticates_with_the_same_keys() -> None:
    created = api_key_create(organization=OrganizationFactory(slug="acme"), scopes="read")
    client = APIClient()
    assert client.get("/api/v1/whoami").status_code in (401, 403)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {created.raw_key}")
    r = client.get("/api/v1/whoami")
    assert r.status_code == 200 and r.json() == {"organization": "acme", "scopes": ["read"]}
    client.credentials(HTTP_AUTHORIZATION="Bearer cl_bad_key")
    assert client.get("/api/v1/whoami").status_code == 401
