from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import BaseCommand

from carbon.services import load_shipped_factors
from demo.showcase import load_demo
from ledger.models import LedgerRequest
from ledger.writer import default_site
from tenancy.locks import database_lock
from tenancy.models import Organization
from tenancy.selectors import api_key_lookup
from tenancy.services import api_key_create, organization_get_or_create, user_create

DEMO_SCOPES = "infer,read,admin"


class Command(BaseCommand):
    help = (
        "Create the 'demo' organization, install the demo models, load the shipped emission factors and a "
        "month of synthetic demo data (once: traffic, hourly intensity series, instruments, thresholds), "
        "create the dashboard user 'demo' (once) and the demo API key "
        "(once per var folder: kept in var/demo-api-key, mode 0600, and reused while it is live). Safe to run "
        "from several processes at once (the database's set-up lock)."
    )

    def handle(self, *args: Any, **opts: Any) -> None:
        # Everything happens under the set-up lock: two replicas starting together would otherwise both find
        # no demo organization, user or data and both create them.
        with database_lock("setup", on_wait=lambda line: self.stderr.write(line)):
            call_command("install_demo_models", stdout=self.stdout)  # into this process's MODEL_REPOSITORY
            org = organization_get_or_create(slug="demo", name="Demo organization")
            for record in load_shipped_factors():
                self.stdout.write(f"loaded {record.row_count} emission factor(s) from {record.name}")
            site = default_site()
            if site.organization_id is None:  # the demo organization operates the local site
                site.organization = org
                site.save(update_fields=["organization"])
            if not LedgerRequest.objects.filter(organization=org).exists():
                self.stdout.write(load_demo(organization=org).summary())
            self.stdout.write(f"demo organization: {org.slug}")
            if not User.objects.filter(username="demo").exists():
                password = os.environ.get("CARBONLEDGER_PASSWORD") or secrets.token_urlsafe(12)
                user_create(organization=org, username="demo", password=password, role="admin")
                self.stdout.write(f"dashboard user: demo / {password} (admin; shown once) at /dashboard/")
            key_file = settings.VAR_DIR / "demo-api-key"
            raw_key, made = _demo_key(org, key_file)
        state = "made now" if made else "kept from an earlier start"
        self.stdout.write(f"demo API key (scopes {DEMO_SCOPES}; {state}; in {key_file}): {raw_key}")


def _demo_key(org: Organization, key_file: Path) -> tuple[str, bool]:
    """The demo key kept in ``key_file`` while it is a live admin key of ``org``, else a new one written there
    (mode 0600, replaced whole): one key however often the demo starts. (The raw key exists only in this file:
    the database keeps its SHA-256.)"""
    try:
        kept = key_file.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        kept = ""
    key = api_key_lookup(kept) if kept else None
    if key is not None and key.organization_id == org.pk and {"infer", "read", "admin"} <= key.scope_set:
        os.chmod(key_file, 0o600)  # only this machine's user may read it
        return kept, False
    created = api_key_create(organization=org, scopes=DEMO_SCOPES, name="demo")
    key_file.parent.mkdir(parents=True, exist_ok=True)
    temporary = key_file.with_name(f".{key_file.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(created.raw_key + "\n")
    os.replace(temporary, key_file)
    return created.raw_key, True
