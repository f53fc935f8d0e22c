"""Reads of the accounting domain."""

from __future__ import annotations

import hmac

from carbonledger.models import ApiKey, Organization
from carbonledger.services import KEY_PREFIX, hash_key


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


def ledger_request_for(organization_id: int, request_id: str) -> dict[str, object] | None:
    """One ledger request of ``organization_id`` with its energy so far; None when not its own."""
    from carbonledger.ledger_selectors import request_energy_parts
    from carbonledger.models import Device, LedgerRequest

    req = LedgerRequest.objects.filter(request_id=request_id, organization_id=organization_id).first()
    if req is None:
        return None
    found = request_energy_parts({request_id: req.batch_id}).get(request_id, [])
    parts = [{"interval_id": p.interval_id, "energy_uj": p.energy_uj, "final": p.final} for p in found]
    total_uj = sum(p.energy_uj for p in found) if found else None
    final = any(p.final for p in found)
    device = (
        Device.objects.filter(device_id=req.device_id)
        .values("method", "measured", "relative_uncertainty")
        .first()
    )
    return {"request": req, "parts": parts, "energy_uj": total_uj, "final": final, "device": device}
