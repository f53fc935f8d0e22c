from __future__ import annotations

from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand

from carbonledger.carbon.services import load_shipped_factors
from carbonledger.ledger_writer import default_site
from carbonledger.services import api_key_create, organization_get_or_create


class Command(BaseCommand):
    help = (
        "Create the 'demo' organization, install the demo models, load the shipped emission factors and "
        "print a new demo API key."
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
        created = api_key_create(organization=org, scopes="infer,read,admin", name="demo")
        self.stdout.write(f"demo organization: {org.slug}")
        self.stdout.write(f"demo API key (scopes infer,read,admin; shown once): {created.raw_key}")
