from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from carbon.selectors import grid_signal
from carbon.services import site_set_carbon_threshold
from ledger.writer import default_site
from tenancy.models import Site
from tenancy.services import ServiceError


class Command(BaseCommand):
    help = (
        "Show or set the carbon-aware threshold of a site (by default the gateway's own site, SITE_NAME, which "
        "may belong to no organization and so cannot be set through the API): --threshold G_PER_KWH, "
        "--percentile P, or --clear for the CARBON_AWARE_PERCENTILE default."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--site", help="site id (default: the gateway's site)")
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--threshold", help="g CO2e/kWh above which serving leans to efficiency")
        group.add_argument("--percentile", type=int, help="percentile (1-99) of the zone's last 30 days")
        group.add_argument("--clear", action="store_true", help="back to CARBON_AWARE_PERCENTILE")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["site"]:
            if not str(opts["site"]).isdigit():
                raise CommandError(f"--site must be a site id, got {opts['site']!r}")
            site = Site.objects.filter(pk=int(opts["site"])).first()
            if site is None:
                raise CommandError(f"no site with id {opts['site']}")
        else:
            site = default_site()
        if opts["threshold"] is not None or opts["percentile"] is not None or opts["clear"]:
            try:
                site_set_carbon_threshold(
                    site=site, threshold_g_per_kwh=opts["threshold"], percentile=opts["percentile"]
                )
            except ServiceError as exc:
                raise CommandError(str(exc)) from None
        signal = grid_signal(site, timezone.now())
        self.stdout.write(
            f"site {site.pk} ({site.name}, {signal.zone}): mode {signal.mode}; "
            f"intensity {signal.intensity_g_per_kwh} g/kWh ({signal.intensity_source}); "
            f"threshold {signal.threshold_g_per_kwh} ({signal.threshold_source})"
        )
