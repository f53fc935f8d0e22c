"""Writes of the accounting domain (HackSoft style: views call these, never the ORM directly)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from carbonledger.models import (
    SCOPES,
    ApiKey,
    LedgerAdjustment,
    LedgerChain,
    LedgerIdle,
    LedgerInterval,
    LedgerRequest,
    Organization,
)

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
    org.full_clean()
    org.save()
    return org


def organization_get_or_create(*, slug: str, name: str = "") -> Organization:
    org = Organization.objects.filter(slug=slug).first()
    return org if org is not None else organization_create(slug=slug, name=name)


@transaction.atomic
def api_key_create(*, organization: Organization, scopes: str | list[str], name: str = "") -> CreatedApiKey:
    scope_list = parse_scopes(scopes)
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


ADJUSTMENT_CHAIN = "adjustments"


@transaction.atomic
def ledger_adjust(
    *, target_kind: str, target_id: str, energy_delta_uj: int, reason: str, actor: str
) -> LedgerAdjustment:
    """Correct the ledger without touching a record: append an adjusting entry (hash-chained)."""
    import time

    from carbonledger.ledger import KINDS, link_hash, normalize

    if target_kind not in ("request", "interval", "idle"):
        raise ServiceError(f"target_kind must be request, interval or idle, got {target_kind!r}")
    if not reason.strip():
        raise ServiceError("an adjustment needs a reason")
    if not actor.strip():
        raise ServiceError("an adjustment needs an actor (who made it)")
    model = {"request": LedgerRequest, "interval": LedgerInterval, "idle": LedgerIdle}[target_kind]
    key = "request_id" if target_kind == "request" else "interval_id"
    if not model.objects.filter(**{key: target_id}).exists():
        raise ServiceError(f"no {target_kind} '{target_id}' in the ledger")
    LedgerChain.objects.get_or_create(chain_id=ADJUSTMENT_CHAIN)
    chain = LedgerChain.objects.select_for_update().get(chain_id=ADJUSTMENT_CHAIN)
    kind = KINDS["adjustment"]
    record = {
        "target_kind": target_kind,
        "target_id": target_id,
        "energy_delta_uj": int(energy_delta_uj),
        "reason": reason.strip(),
        "actor": actor.strip(),
        "created_ns": time.time_ns(),
    }
    values = normalize(kind, record)
    seq = chain.head_seq + 1
    digest = link_hash(chain.head_hash, "adjustment", seq, values)
    adj = LedgerAdjustment.objects.create(
        chain=chain, seq=seq, prev_hash=chain.head_hash, hash=digest, **record
    )
    chain.head_seq = seq
    chain.head_hash = digest
    chain.save(update_fields=["head_seq", "head_hash"])
    return adj


def ledger_verify(*, full: bool = False) -> list[Any]:
    """Verify every chain and record the result (a ``LedgerVerification`` per chain).

    Incremental by default: from the newest intact verification of each chain (the records up to it were
    linked then; a later full run re-checks them). ``full`` starts every chain from genesis.
    """
    from carbonledger.ledger import GENESIS
    from carbonledger.ledger_verify import verify_chain
    from carbonledger.models import LedgerVerification

    results = []
    for chain in LedgerChain.objects.order_by("pk"):
        start = timezone.now()
        last = (
            None
            if full
            else LedgerVerification.objects.filter(chain=chain, problem="").order_by("-seq").first()
        )
        after_seq, after_hash = (last.seq, last.hash) if last is not None else (0, GENESIS)
        report = verify_chain(chain, after_seq, after_hash)
        results.append(
            LedgerVerification.objects.create(
                chain=chain,
                from_seq=after_seq,
                seq=chain.head_seq if report.broken is None else report.broken.seq - 1,
                hash=chain.head_hash if report.broken is None else "",
                records=report.records,
                problem="" if report.broken is None else str(report.broken),
                started_at=start,
                finished_at=timezone.now(),
            )
        )
    return results


# -- dashboard users ----------------------------------------------------------------------------


def user_create(*, organization: Organization, username: str, password: str, role: str = "viewer") -> Any:
    """A dashboard user of one organization with a role (viewer, analyst, admin)."""
    from django.contrib.auth.models import User
    from django.contrib.auth.password_validation import validate_password
    from django.core.exceptions import ValidationError

    from carbonledger.models import Membership

    if role not in Membership.Role.values:
        raise ServiceError(f"role must be one of {', '.join(Membership.Role.values)}, got {role!r}")
    if not username.strip():
        raise ServiceError("a username is required")
    if User.objects.filter(username=username).exists():
        raise ServiceError(f"the username '{username}' is taken")
    user = User(username=username)
    try:
        validate_password(password, user)
    except ValidationError as exc:
        raise ServiceError("; ".join(exc.messages)) from None
    with transaction.atomic():
        user.set_password(password)
        user.save()
        Membership.objects.create(user=user, organization=organization, role=role)
    return user
