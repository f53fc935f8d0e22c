from __future__ import annotations

import os
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import BaseCommand

from carbon.rollups import rollups_update
from carbon.services import load_shipped_factors
from demo.synthetic_ledger import generate_ledger
from ledger.models import LedgerRequest
from ledger.writer import default_site
from tenancy.services import api_key_create, organization_get_or_create, user_create


class Command(BaseCommand):
    help = (
        "Create the 'demo' organization, install the demo models, load the shipped emission factors and a "
        "month of synthetic demo traffic (once), create the dashboard user 'demo' (once) and print a new "
        "demo API key (also written to var/demo-api-key)."
    )

    def handle(self, *args: Any, **opts: Any) -> None:
        org = organization_get_or_create(slug="demo", name="Demo organization")
        call_command("install_demo_models", stdout=self.stdout)
        for record in load_shipped_factors():
            self.stdout.write(f"loaded {record.row_count} emission factor(s) from {record.name}")
        site = default_site()
        if site.organization_id is None:  # the demo organization operates the local site
            site.organization = org
            site.save(update_fields=["organization"])
        if not LedgerRequest.objects.filter(organization=org).exists():
            result = generate_ledger(organization=org, requests=50_000, days=30, seed=42)
            rollups_update()
            self.stdout.write(
                f"demo data: {result.requests} synthetic requests over 30 days (marked synthetic)"
            )
        created = api_key_create(organization=org, scopes="infer,read,admin", name="demo")
        self.stdout.write(f"demo organization: {org.slug}")
        if not User.objects.filter(username="demo").exists():
            password = os.environ.get("CARBONLEDGER_PASSWORD") or secrets.token_urlsafe(12)
            user_create(organization=org, username="demo", password=password, role="admin")
            self.stdout.write(f"dashboard user: demo / {password} (admin; shown once) at /dashboard/")
        # Kept for the README's first request (only this machine's user may read it).
        key_file = settings.VAR_DIR / "demo-api-key"
        key_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(created.raw_key + "\n")
        self.stdout.write(f"demo API key (scopes infer,read,admin; also in {key_file}): {created.raw_key}")
