"""Dashboard users signed in through a test client."""

from __future__ import annotations

from django.test import Client

from tenancy.models import Organization
from tenancy.services import user_create

PASSWORD = "a-long-test-password-42"


def signed_in(
    org: Organization, role: str, *, username: str | None = None, client: Client | None = None
) -> Client:
    """A new user of ``org`` with ``role`` (named ``<role>-<slug>`` unless ``username``), signed in on ``client``
    (a new Django test client unless given, e.g. DRF's ``APIClient``)."""
    name = username or f"{role}-{org.slug}"
    user_create(organization=org, username=name, password=PASSWORD, role=role)
    signed = client if client is not None else Client()
    assert signed.login(username=name, password=PASSWORD)
    return signed
