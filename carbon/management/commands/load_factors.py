from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from carbon.services import load_shipped_factors


class Command(BaseCommand):
    help = "Load the public grid-intensity figures shipped with the product (once; later runs do nothing)."

    def handle(self, *args: Any, **opts: Any) -> None:
        made = load_shipped_factors()
        for record in made:
            self.stdout.write(
                f"loaded {record.row_count} factor(s) from {record.name} as version {record.pk}"
            )
        if not made:
            self.stdout.write("the shipped figures are already loaded")
