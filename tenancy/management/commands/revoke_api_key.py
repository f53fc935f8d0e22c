from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenancy.models import ApiKey
from tenancy.services import api_key_revoke


class Command(BaseCommand):
    help = "Revoke an API key by its prefix (the part after 'cl_')."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("prefix")

    def handle(self, *args: Any, **opts: Any) -> None:
        key = ApiKey.objects.filter(prefix=opts["prefix"]).first()
        if key is None:
            raise CommandError(f"no API key with the prefix '{opts['prefix']}'")
        if key.revoked_at is not None:
            raise CommandError(
                f"the API key {key.prefix} was already revoked at {key.revoked_at.isoformat()}"
            )
        api_key_revoke(api_key=key)
        self.stdout.write(f"revoked {key.prefix}")
