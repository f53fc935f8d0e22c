from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenancy.services import ServiceError, organization_create


class Command(BaseCommand):
    help = "Create an organization."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default="")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            org = organization_create(slug=opts["slug"], name=opts["name"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"created organization {org.slug}")
