"""Reads of tenancy: API keys and organizations."""

from __future__ import annotations

import hmac

from tenancy.models import ApiKey, Lease, Organization
from tenancy.services import KEY_PREFIX, hash_key


def api_key_lookup(raw_key: str) -> ApiKey | None:
    """The active key matching ``raw_key``, or None (unknown, malformed or revoked)."""
    parts = raw_key.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX:
        return None
    key = ApiKey.objects.select_related("organization").filter(prefix=parts[1]).first()
    if key is None or key.revoked_at is not None:
        return None
    if not hmac.compare_digest(key.key_sha256, hash_key(raw_key)):
        return None
    return key


def organization_by_slug(slug: str) -> Organization | None:
    return Organization.objects.filter(slug=slug).first()


def api_keys_of(organization: Organization) -> list[ApiKey]:
    return list(ApiKey.objects.filter(organization=organization))


def leases_with_prefix(prefix: str) -> list[Lease]:
    """Every lease whose name starts with ``prefix`` (``worker:``...), live or lapsed, by name."""
    return list(Lease.objects.filter(name__startswith=prefix).order_by("name"))
