from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenancy import selectors
from tenancy.services import ServiceError, api_key_create


class Command(BaseCommand):
    help = "Create an API key for an organization; the key is printed once, on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("org_slug")
        parser.add_argument("--scopes", default="infer,read", help="comma-separated: infer, read, admin")
        parser.add_argument("--name", default="")

    def handle(self, *args: Any, **opts: Any) -> None:
        org = selectors.organization_by_slug(opts["org_slug"])
        if org is None:
            raise CommandError(f"no organization with the slug '{opts['org_slug']}'")
        try:
            created = api_key_create(organization=org, scopes=opts["scopes"], name=opts["name"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stderr.write(
            f"API key {created.api_key.prefix} for {org.slug} with scopes {created.api_key.scopes} "
            "(shown once; store it now):"
        )
        self.stdout.write(created.raw_key)
