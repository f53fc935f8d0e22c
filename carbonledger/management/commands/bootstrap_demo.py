from __future__ import annotations

from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand

from carbonledger.services import api_key_create, organization_get_or_create


class Command(BaseCommand):
    help = "Create the 'demo' organization, install the demo models and print a new demo API key."

    def handle(self, *args: Any, **opts: Any) -> None:
        org = organization_get_or_create(slug="demo", name="Demo organization")
        call_command("install_demo_models", stdout=self.stdout)
        created = api_key_create(organization=org, scopes="infer,read,admin", name="demo")
        self.stdout.write(f"demo organization: {org.slug}")
        self.stdout.write(f"demo API key (scopes infer,read,admin; shown once): {created.raw_key}")
