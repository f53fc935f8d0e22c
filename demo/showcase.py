"""Writes: the demo's data, made to show what the product does, every piece of it synthetic and marked so.

- a month of synthetic traffic (:mod:`demo.synthetic_ledger`, workload ``demo``) at which idle is 20-40 % of
  the devices' energy;
- an hourly intensity series for each zone of the organization's sites, shaped from the annual figure the
  inventory uses for the zone with a typical daily curve (night trough, morning rise, midday solar dip,
  evening peak), each day's mean equal to the annual figure; imported as the organization's own factor
  version whose source says SYNTHETIC, from the start of the traffic to a day past its end (so the live
  carbon-aware signal has the hour's figure);
- a granular GO with hourly volumes (a solar profile) and an annual REC in the owned site's market, so the
  market-based figure and the hourly-matched share differ from location-based and from each other;
- a carbon-aware threshold at each site (the zone's annual figure: the mode follows the daily curve);
- a net revenue, so the ESRS intensities are shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from carbon import co2e
from carbon.models import ContractualInstrument, FactorImport
from carbon.rollups import rollups_update
from carbon.selectors import factor_set
from carbon.services import (
    factor_import_csv,
    import_errors,
    instrument_certificates_import,
    instrument_create,
    site_set_carbon_threshold,
)
from demo.synthetic_ledger import generate_ledger
from reports.services import net_revenue_set
from tenancy.models import Organization, Site
from tenancy.services import ServiceError

DEMO_DAYS = 30
#: The demo workload's traffic per day: the GPU busy about a fifth of the time (see demo.synthetic_ledger).
REQUESTS_PER_DAY = 4_000
DEMO_SEED = 42
NET_REVENUE_EUR = Decimal("2400000")
_HOUR = timedelta(hours=1)
_STORE = Decimal("0.000001")  # the factor column's places
_MARK = "SYNTHETIC demo series, not a measurement"
_CRITERIA = dict.fromkeys(
    (
        "conveys_attributes",
        "unique_claim",
        "retired_for_reporter",
        "vintage_matches_period",
        "same_market",
        "residual_mix_adjusted",
    ),
    True,
)


@dataclass(frozen=True)
class _Curve:
    """A zone's daily curve: its UTC offset (standard time) and the amplitudes of the bumps of the day."""

    utc_offset_h: int
    evening: float
    morning: float
    solar: float
    night: float


# France: nuclear baseload, gas and imports at the evening peak, solar at midday. Virginia: gas and coal
# following the load, a smaller solar share. Other zones: a middling curve.
_CURVES = {
    "FR": _Curve(1, 0.45, 0.2, 0.3, 0.15),
    "US-VA": _Curve(-5, 0.25, 0.12, 0.15, 0.12),
}
_DEFAULT_CURVE = _Curve(0, 0.3, 0.15, 0.2, 0.12)


@dataclass(frozen=True)
class DemoData:
    start: datetime
    end: datetime
    requests: int
    records: int
    zones: tuple[str, ...]
    instruments: tuple[str, ...]

    def summary(self) -> str:
        return (
            f"demo data (all synthetic and marked so): {self.requests} requests from {self.start:%Y-%m-%d %H:%M}"
            f" to {self.end:%Y-%m-%d %H:%M} UTC, hourly intensity series for {', '.join(self.zones)}, "
            f"instruments {', '.join(self.instruments)}, carbon-aware thresholds, net revenue"
        )


def _bump(hour: float, centre: float, width: float) -> float:
    distance = min(abs(hour - centre), 24 - abs(hour - centre))
    return math.exp(-(distance**2) / (2 * width**2))


def daily_curve(zone: str, annual: Decimal) -> list[Decimal]:
    """24 figures (g/kWh) for the UTC hours 0-23 whose mean is exactly ``annual``."""
    curve = _CURVES.get(zone, _DEFAULT_CURVE)
    shape = []
    for utc_hour in range(24):
        local = (utc_hour + curve.utc_offset_h + 0.5) % 24
        shape.append(
            1
            + curve.evening * _bump(local, 19.5, 2.5)
            + curve.morning * _bump(local, 8, 1.8)
            - curve.solar * _bump(local, 13, 2.8)
            - curve.night * _bump(local, 3.5, 2.5)
        )
    mean = sum(shape) / 24
    values = [(annual * Decimal(repr(v / mean))).quantize(_STORE) for v in shape]
    # The rounding's remainder goes to the peak hour, so the day's mean is the annual figure exactly.
    peak = values.index(max(values))
    values[peak] += annual * 24 - sum(values, Decimal(0))
    return values


def _annual(zone: str, organization: Organization, at: datetime) -> co2e.Factor:
    factors = factor_set([zone], organization.pk)
    return co2e.select_factor(zone, at, factors.candidates(zone, at)).factor


def _import_series(organization: Organization, annual: co2e.Factor, start: datetime, end: datetime) -> None:
    zone = annual.zone
    curve = daily_curve(zone, annual.intensity_g_per_kwh)
    lines = ["zone,datetime,g_co2e_per_kwh,basis"]
    hour = start
    while hour < end:
        lines.append(f"{zone},{hour:%Y-%m-%dT%H:%M:%SZ},{curve[hour.hour]},{annual.basis}")
        hour += _HOUR
    record = factor_import_csv(
        data=("\n".join(lines) + "\n").encode(),
        name=f"synthetic hourly series {zone} (demo)",
        organization=organization,
        created_by="demo",
        source=(
            f"{_MARK}: a typical daily curve on {annual.source} "
            f"({annual.period_start.year} mean {format(annual.intensity_g_per_kwh.normalize(), 'f')} g/kWh)"
        ),
        licence=f"{annual.licence} (derived: synthetic)" if annual.licence else "synthetic",
        url="",
    )
    if record.status != FactorImport.Status.ACCEPTED:
        raise ServiceError(f"the demo series for {zone} was refused: {import_errors(record)[0][:3]}")


def _solar_wh(local_hour: int, daily_wh: int) -> int:
    """A clear-day solar profile over 07:00-19:00 local time, summing to about ``daily_wh``."""
    if not 7 <= local_hour < 19:
        return 0
    return int(daily_wh * math.sin(math.pi * (local_hour - 7 + 0.5) / 12) * math.pi / 24)


def _instruments(
    organization: Organization, zone: str, start: datetime, end: datetime, days: int
) -> tuple[str, ...]:
    """A granular GO with hourly (solar) volumes over the traffic and a day past it, and an annual REC."""
    # The owned GPU site draws about 2.9 kWh of facility energy a day at the demo's traffic: the GO's solar
    # day holds about 60 % of that, all of it around midday; the REC about a fifth of the period's.
    daily_wh = 1_600
    offset = _CURVES.get(zone, _DEFAULT_CURVE).utc_offset_h
    vintage_end = end + timedelta(days=1)
    rows = ["certificate_id,production_start,production_end,energy_wh,energy_source"]
    hour = start
    while hour < vintage_end:
        wh = _solar_wh((hour.hour + offset) % 24, daily_wh)
        if wh:
            rows.append(
                f"DEMO-GC-{zone}-{hour:%Y%m%d%H},{hour:%Y-%m-%dT%H:%M:%SZ},"
                f"{hour + _HOUR:%Y-%m-%dT%H:%M:%SZ},{wh},solar"
            )
        hour += _HOUR
    data = ("\n".join(rows) + "\n").encode()
    total_wh = sum(int(r.rsplit(",", 2)[1]) for r in rows[1:])
    go = instrument_create(
        organization=organization,
        instrument_id=f"DEMO-GO-{zone}-SOLAR",
        kind="GO",
        zone=zone,
        vintage_start=start,
        vintage_end=vintage_end,
        mwh=Decimal(total_wh).scaleb(-6),
        certificate_ids=f"DEMO-GC-{zone}-* (hourly, synthetic)",
        retirement_evidence="synthetic demo instrument: no certificate was issued or cancelled",
        quality_criteria=_CRITERIA,
        notes="SYNTHETIC demo instrument with hourly volumes (granular certificates)",
        created_by="demo",
    )
    instrument_certificates_import(instrument=go, data=data, created_by="demo")
    rec = instrument_create(
        organization=organization,
        instrument_id=f"DEMO-REC-{zone}-ANNUAL",
        kind="REC",
        zone=zone,
        vintage_start=start,
        vintage_end=start + timedelta(days=365),
        mwh=Decimal(550 * days).scaleb(-6),
        certificate_ids="DEMO-REC-1 (annual, synthetic)",
        retirement_evidence="synthetic demo instrument: no certificate was issued or cancelled",
        quality_criteria=_CRITERIA,
        notes="SYNTHETIC demo instrument, matched annually",
        created_by="demo",
    )
    return go.instrument_id, rec.instrument_id


def load_demo(
    *,
    organization: Organization,
    days: int = DEMO_DAYS,
    end: datetime | None = None,
    seed: int = DEMO_SEED,
) -> DemoData:
    """Load the demo's data for ``organization`` (once: a second load of the same seed is refused) and roll it
    up. ``days`` of traffic ending at ``end`` (default: the start of the current hour)."""
    if ContractualInstrument.objects.filter(
        organization=organization, instrument_id__startswith="DEMO-"
    ).exists():
        raise ServiceError(f"the demo data is already loaded for {organization.slug}")
    ledger = generate_ledger(
        organization=organization,
        requests=REQUESTS_PER_DAY * days,
        days=days,
        end=end or datetime.now(UTC),
        seed=seed,
        workload="demo",
    )
    start, stop = ledger.start, ledger.end
    sites = list(Site.objects.filter(organization=organization).order_by("pk"))
    zones = tuple(sorted({s.zone for s in sites}))
    # The annual figures the inventory uses, read before the hourly series hides them.
    annual = {zone: _annual(zone, organization, start) for zone in zones}
    for zone in zones:
        _import_series(organization, annual[zone], start, stop + timedelta(days=1))
    owned = [s for s in sites if s.electricity != Site.Electricity.CLOUD]
    market = owned[0].zone if owned else zones[0]
    instruments = _instruments(organization, market, start, stop, days)
    for site in sites:
        site_set_carbon_threshold(site=site, threshold_g_per_kwh=annual[site.zone].intensity_g_per_kwh)
    net_revenue_set(organization=organization, amount=NET_REVENUE_EUR, currency="EUR", year=stop.year)
    rollups_update()
    return DemoData(start, stop, ledger.requests, ledger.records, zones, instruments)
