"""Writes of tenancy: organizations, API keys and dashboard users (views call these, never the ORM)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from tenancy.models import SCOPES, ApiKey, Membership, Organization

KEY_PREFIX = "cl"


class ServiceError(ValueError):
    """A request to a service that cannot be honoured; the message says why."""


@dataclass(frozen=True)
class CreatedApiKey:
    api_key: ApiKey
    raw_key: str  # shown once, never stored


def hash_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


def parse_scopes(raw: str | list[str] | tuple[str, ...]) -> list[str]:
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    scopes = sorted({s.strip() for s in items if s.strip()})
    if not scopes:
        raise ServiceError(f"at least one scope is needed; choose from {', '.join(SCOPES)}")
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown:
        raise ServiceError(f"unknown scope(s) {', '.join(unknown)}; choose from {', '.join(SCOPES)}")
    return scopes


def organization_create(*, slug: str, name: str = "") -> Organization:
    if Organization.objects.filter(slug=slug).exists():
        raise ServiceError(f"an organization with the slug '{slug}' already exists")
    org = Organization(slug=slug, name=name or slug)
    try:
        org.full_clean()
    except ValidationError as exc:
        raise ServiceError(
            "; ".join(f"{field}: {' '.join(m)}" for field, m in exc.message_dict.items())
        ) from None
    org.save()
    return org


def organization_get_or_create(*, slug: str, name: str = "") -> Organization:
    org = Organization.objects.filter(slug=slug).first()
    return org if org is not None else organization_create(slug=slug, name=name)


@transaction.atomic
def api_key_create(*, organization: Organization, scopes: str | list[str], name: str = "") -> CreatedApiKey:
    scope_list = parse_scopes(scopes)
    limit = ApiKey._meta.get_field("name").max_length or 0
    if len(name) > limit:
        raise ServiceError(f"the key's name must be at most {limit} characters, got {len(name)}")
    if "\x00" in name:
        raise ServiceError("the key's name contains a NUL character")
    prefix = secrets.token_hex(6)
    raw = f"{KEY_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    key = ApiKey.objects.create(
        organization=organization,
        name=name,
        prefix=prefix,
        key_sha256=hash_key(raw),
        scopes=",".join(scope_list),
    )
    return CreatedApiKey(api_key=key, raw_key=raw)


def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
    return api_key


# -- dashboard users ----------------------------------------------------------------------------


def user_create(*, organization: Organization, username: str, password: str, role: str = "viewer") -> Any:
    """A dashboard user of one organization with a role (viewer, analyst, admin)."""
    if role not in Membership.Role.values:
        raise ServiceError(f"role must be one of {', '.join(Membership.Role.values)}, got {role!r}")
    if not username.strip():
        raise ServiceError("a username is required")
    if User.objects.filter(username=username).exists():
        raise ServiceError(f"the username '{username}' is taken")
    user = User(username=username)
    try:
        # The username's own rules (150 characters, letters, digits and @.+-_), which save() does not check.
        user.clean_fields(exclude=[f.name for f in User._meta.fields if f.name != "username"])
    except ValidationError as exc:
        raise ServiceError("username: " + " ".join(exc.message_dict["username"])) from None
    try:
        validate_password(password, user)
    except ValidationError as exc:
        raise ServiceError("; ".join(exc.messages)) from None
    with transaction.atomic():
        user.set_password(password)
        user.save()
        Membership.objects.create(user=user, organization=organization, role=role)
    return user
