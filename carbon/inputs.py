"""The inputs of the pure core (:mod:`carbon.co2e`) made from the database's records: one place, so that the
rollups' stored CO2e, the carbon summary and a job's emissions value an hour of energy the same way."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from carbon import co2e
from carbon.models import HourlyRollup, PueRecord
from tenancy.models import Site

HOUR = timedelta(hours=1)


def hour_consumption(
    site: Site,
    hour: datetime,
    energy_uj: int,
    *,
    pue: Decimal,
    pue_relative_uncertainty: Decimal,
    meter_relative_uncertainty: Decimal,
    tag: str,
) -> co2e.Consumption:
    """``energy_uj`` of IT energy drawn at ``site`` in the UTC hour that starts at ``hour``, at ``pue``."""
    start = hour.astimezone(UTC)
    return co2e.Consumption(
        site_id=str(site.pk),
        zone=site.zone,
        start=start,
        end=start + HOUR,
        energy_j=Decimal(energy_uj).scaleb(-6),
        pue=pue,
        pue_relative_uncertainty=pue_relative_uncertainty,
        meter_relative_uncertainty=meter_relative_uncertainty,
        scope_category=site.scope_category,  # type: ignore[arg-type]
        tag=tag,
    )


def rollup_consumption(row: HourlyRollup, site: Site, pue_record: PueRecord) -> co2e.Consumption:
    """An hourly rollup at its site, at the PUE record in force at its hour, tagged with the row's id (each
    result line of the core names the row it came from)."""
    return hour_consumption(
        site,
        row.hour,
        row.energy_uj,
        pue=pue_record.pue,
        pue_relative_uncertainty=pue_record.relative_uncertainty,
        meter_relative_uncertainty=row.meter_relative_uncertainty,
        tag=str(row.pk),
    )
