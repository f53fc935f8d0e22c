from __future__ import annotations

import os
import secrets
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenancy import selectors
from tenancy.services import ServiceError, user_create


class Command(BaseCommand):
    help = (
        "Create a dashboard user in an organization with a role (viewer, analyst, admin). The password comes "
        "from $CARBONLEDGER_PASSWORD, else a random one is printed once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("org_slug")
        parser.add_argument("username")
        parser.add_argument("--role", default="viewer", choices=("viewer", "analyst", "admin"))

    def handle(self, *args: Any, **opts: Any) -> None:
        org = selectors.organization_by_slug(opts["org_slug"])
        if org is None:
            raise CommandError(f"no organization with the slug '{opts['org_slug']}'")
        password = os.environ.get("CARBONLEDGER_PASSWORD") or secrets.token_urlsafe(12)
        try:
            user_create(organization=org, username=opts["username"], password=password, role=opts["role"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"user {opts['username']} ({opts['role']}) in {org.slug}")
        if "CARBONLEDGER_PASSWORD" not in os.environ:
            self.stdout.write(f"password (shown once): {password}")
