"""Reads of the carbon domain: the factor versions, PUE records, instruments and residual mixes a
calculation uses, turned into the pure core's types (:mod:`carbon.co2e`), and rollup queries."""

from __future__ import annotations

import bisect
import functools
import hashlib
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Q, Sum

from carbon import co2e
from carbon.energy_mix import GenerationMix, parse_mix_csv
from carbon.hourly import HourlyMatching, hourly_matching
from carbon.inputs import rollup_consumption
from carbon.models import (
    ContractualInstrument,
    EmissionFactor,
    FactorImport,
    HourlyRollup,
    InstrumentCertificate,
    PueRecord,
    ResidualMix,
)
from carbon.provider_config import configured_providers
from carbon.providers import IntensityProvider
from tenancy.models import Device, Site


@dataclass
class FactorSet:
    """The location-based factors of some zones, one version per zone and period.

    Where several imports cover the same zone and period, the preferred basis wins
    (``FACTOR_BASIS_PREFERENCE``), then the newest import: a new import is a new version.
    """

    annual: dict[str, list[co2e.Factor]] = field(default_factory=dict)
    hourly: dict[tuple[str, datetime], co2e.Factor] = field(default_factory=dict)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)

    def candidates(self, zone: str, hour: datetime) -> list[co2e.Factor]:
        """What :func:`co2e.select_factor` should choose among for ``zone`` at ``hour``."""
        hourly = self.hourly.get((zone, hour))
        return [hourly] if hourly is not None else self.annual.get(zone, [])

    def all(self) -> list[co2e.Factor]:
        return [f for fs in self.annual.values() for f in fs] + list(self.hourly.values())


_FACTOR_FIELDS = (
    "id",
    "factor_import_id",
    "zone",
    "zone_name",
    "granularity",
    "period_start",
    "period_end",
    "intensity_g_per_kwh",
    "basis",
    "gases",
    "source",
    "licence",
    "url",
    "published",
    "estimated",
    "relative_uncertainty",
)


def factor_owners(organization_id: int | None) -> Q:
    """The factor records ``organization_id`` may use: shared imports and its own private ones."""
    owners = Q(factor_import__organization__isnull=True)
    if organization_id is not None:
        owners |= Q(factor_import__organization_id=organization_id)
    return owners


def factor_set(
    zones: Iterable[str],
    organization_id: int | None,
    start: datetime | None = None,
    end: datetime | None = None,
) -> FactorSet:
    """Annual factors of ``zones`` and their hourly factors in [start, end) (all hours when open)."""
    zone_list = sorted(set(zones))
    owners = factor_owners(organization_id)
    hourly = Q(granularity="hour")
    if start is not None:
        hourly &= Q(period_start__gte=start)
    if end is not None:
        hourly &= Q(period_start__lt=end)
    rows = (
        EmissionFactor.objects.filter(owners, zone__in=zone_list)
        .filter(factor_import__status=FactorImport.Status.ACCEPTED)
        .filter(Q(granularity="year") | hourly)
        .values(*_FACTOR_FIELDS)
    )
    preferred = settings.FACTOR_BASIS_PREFERENCE
    best: dict[tuple[str, str, datetime], dict[str, Any]] = {}
    for row in rows:
        key = (row["zone"], row["granularity"], row["period_start"])
        rank = (row["basis"] == preferred, row["factor_import_id"], row["id"])
        held = best.get(key)
        if held is None or rank > (held["basis"] == preferred, held["factor_import_id"], held["id"]):
            best[key] = row
    result = FactorSet()
    for (zone, granularity, period_start), row in best.items():
        factor = co2e.Factor(
            factor_id=str(row["id"]),
            zone=zone,
            period_start=period_start,
            period_end=row["period_end"],
            granularity=granularity,
            intensity_g_per_kwh=row["intensity_g_per_kwh"],
            basis=row["basis"],
            source=row["source"],
            licence=row["licence"],
            relative_uncertainty=row["relative_uncertainty"],
        )
        result.records[factor.factor_id] = row
        if granularity == "hour":
            result.hourly[(zone, period_start)] = factor
        else:
            result.annual.setdefault(zone, []).append(factor)
    return result


class PueHistory:
    """The PUE records of sites, to find the one valid at an hour."""

    def __init__(self, site_ids: Iterable[int]) -> None:
        self._records: dict[int, list[PueRecord]] = defaultdict(list)
        for record in PueRecord.objects.filter(site_id__in=set(site_ids)).order_by("valid_from", "id"):
            self._records[record.site_id].append(record)
        self._starts = {site: [r.valid_from for r in rs] for site, rs in self._records.items()}

    def at(self, site_id: int, hour: datetime) -> PueRecord | None:
        records = self._records.get(site_id)
        if not records:
            return None
        # The latest record valid at the hour; several with the same valid_from: the newest.
        index = bisect.bisect_right(self._starts[site_id], hour) - 1
        return records[max(index, 0)]


def hourly_volumes(instrument_pks: Iterable[int]) -> dict[int, dict[datetime, Decimal]]:
    """MWh per UTC hour of the instruments that hold granular certificates, by instrument pk."""
    volumes: dict[int, dict[datetime, Decimal]] = defaultdict(dict)
    rows = (
        InstrumentCertificate.objects.filter(instrument_id__in=list(instrument_pks))
        .values("instrument_id", "hour")
        .annotate(wh=Sum("energy_wh"))
        .order_by("instrument_id", "hour")
    )
    for row in rows:
        volumes[row["instrument_id"]][row["hour"].astimezone(UTC)] = Decimal(row["wh"]).scaleb(-6)
    return dict(volumes)


def _core_instrument(
    record: ContractualInstrument, hourly: dict[datetime, Decimal] | None
) -> co2e.Instrument:
    return co2e.Instrument(
        instrument_id=record.instrument_id,
        kind=record.kind,  # type: ignore[arg-type]
        zone=record.zone,
        vintage_start=record.vintage_start,
        vintage_end=record.vintage_end,
        # An instrument with certificates holds what they hold (the column follows each import).
        mwh=record.mwh if hourly is None else sum(hourly.values(), Decimal(0)),
        intensity_g_per_kwh=record.intensity_g_per_kwh,
        quality_criteria=dict(record.quality_criteria),
        hourly_mwh=hourly,
    )


def instruments_of(organization_id: int) -> tuple[list[co2e.Instrument], dict[str, ContractualInstrument]]:
    records = list(ContractualInstrument.objects.filter(organization_id=organization_id))
    volumes = hourly_volumes(r.pk for r in records)
    instruments = [_core_instrument(r, volumes.get(r.pk)) for r in records]
    return instruments, {r.instrument_id: r for r in records}


def residual_mixes_of(organization_id: int | None) -> list[co2e.ResidualMix]:
    """One residual mix per zone and year: the organization's own over the shared ones, newest first."""
    owners = Q(organization__isnull=True)
    if organization_id is not None:
        owners |= Q(organization_id=organization_id)
    chosen: dict[tuple[str, int], ResidualMix] = {}
    for mix in ResidualMix.objects.filter(owners).order_by("id"):
        key = (mix.zone, mix.year)
        held = chosen.get(key)
        if held is None or (mix.organization_id is not None) >= (held.organization_id is not None):
            chosen[key] = mix
    return [
        co2e.ResidualMix(
            zone=m.zone,
            year=m.year,
            intensity_g_per_kwh=m.intensity_g_per_kwh,
            source=f"residual mix {m.pk}: {m.source}",
            relative_uncertainty=m.relative_uncertainty,
        )
        for m in chosen.values()
    ]


MIX_FILE = Path(__file__).resolve().parent / "data" / "grid-intensity" / "owid_electricity_mix_2021_2023.csv"


@functools.cache
def generation_mixes() -> tuple[dict[str, GenerationMix], str]:
    """The shipped generation mixes by zone (:mod:`carbon.energy_mix`) and the file's SHA-256."""
    data = MIX_FILE.read_bytes()
    return parse_mix_csv(data.decode("utf-8")), hashlib.sha256(data).hexdigest()


def factor_attributions(
    factor_ids: Iterable[int] | None = None, *, organization_id: int | None = None
) -> list[dict[str, str]]:
    """Source, licence and address of factors (all accepted ones visible to ``organization_id`` -- its own
    and the shared ones -- when ``factor_ids`` is None): the attribution every page and report that shows
    them must carry."""
    owners = Q(factor_import__organization__isnull=True)
    if organization_id is not None:
        owners |= Q(factor_import__organization_id=organization_id)
    qs = EmissionFactor.objects.filter(owners, factor_import__status=FactorImport.Status.ACCEPTED)
    if factor_ids is not None:
        qs = qs.filter(id__in=list(factor_ids))
    return list(qs.values("source", "licence", "url").distinct().order_by("source", "licence", "url"))


# -- rollups -------------------------------------------------------------------------------------


def synthetic_share(organization_id: int) -> Decimal | None:
    """The share of the organization's rolled-up energy that synthetic records (generated demo traffic) hold;
    None when it has none, so pages of real traffic show nothing about them."""
    if not HourlyRollup.objects.filter(organization_id=organization_id, synthetic=True).exists():
        return None
    totals = HourlyRollup.objects.filter(organization_id=organization_id).aggregate(
        every=Sum("energy_uj"), made_up=Sum("energy_uj", filter=Q(synthetic=True))
    )
    every, made_up = totals["every"] or 0, totals["made_up"] or 0
    return Decimal(made_up) / Decimal(every) if every > 0 else Decimal(1)


def rollups_of(
    organization_id: int,
    start: datetime,
    end: datetime,
    *,
    model: str | None = None,
    site_id: int | None = None,
) -> Any:
    """The hourly rollups of one organization over [start, end), of one model and one site when given (a
    model filter leaves idle energy out: it belongs to no model)."""
    qs = HourlyRollup.objects.filter(organization_id=organization_id, hour__gte=start, hour__lt=end)
    if model:
        qs = qs.filter(model=model)
    if site_id is not None:
        qs = qs.filter(site_id=site_id)
    return qs


def rollup_totals(
    organization_id: int,
    start: datetime,
    end: datetime,
    *,
    model: str | None = None,
    site_id: int | None = None,
) -> dict[str, Any]:
    """Totals of one organization over [start, end) from the hourly rollups (of one model, one site)."""
    qs = rollups_of(organization_id, start, end, model=model, site_id=site_id)
    # Aliases differ from the field names: Django refuses an aggregate named like a field it sums.
    totals = qs.aggregate(
        n=Sum("requests"),
        all_uj=Sum("energy_uj"),
        idle=Sum("energy_uj", filter=Q(kind="idle")),
        measured=Sum("energy_uj", filter=Q(measured=True)),
        location=Sum("location_co2e_g"),
        market=Sum("market_co2e_g"),
    )
    return {
        "requests": totals["n"] or 0,
        "energy_uj": totals["all_uj"] or 0,
        "idle_uj": totals["idle"] or 0,
        "measured_uj": totals["measured"] or 0,
        "location_co2e_g": totals["location"] or Decimal(0),
        "market_co2e_g": totals["market"] or Decimal(0),
    }


@dataclass
class CarbonSummary:
    """The carbon inventory of one organization over [start, end), from the hourly rollups, computed by the
    pure core (:mod:`carbon.co2e`) with the factor versions, PUE records and instruments in force."""

    organization_id: int
    start: datetime
    end: datetime
    requests: int
    energy_uj: int  # IT energy, requests and idle
    idle_uj: int
    energy_uj_by_method: dict[str, int]
    measured_uj: int
    location: co2e.LocationResult
    market: co2e.MarketResult
    sci_g_per_request: Decimal | None
    embodied_g: Decimal
    factor_records: dict[str, dict[str, Any]]
    pue_records: list[dict[str, Any]]
    instruments: dict[str, ContractualInstrument]
    not_valued: list[dict[str, Any]]  # rows with no CO2e, and why
    rollup_rows: int
    rows: dict[str, HourlyRollup]  # by the tag (str(pk)) that every result line carries
    sites: dict[int, Any]
    # Own operations' consumption matched hour by hour against hourly carbon-free instruments (the GHG
    # Protocol Scope 2 revision's proposal, shown beside the annual method; not part of the inventory).
    hourly_match: HourlyMatching


MARKET_ERROR_PREFIX = "market-based: "


def _rollups(organization_id: int, start: datetime, end: datetime) -> list[HourlyRollup]:
    return list(
        HourlyRollup.objects.filter(organization_id=organization_id, hour__gte=start, hour__lt=end).order_by(
            "hour", "id"
        )
    )


@dataclass(frozen=True)
class _SummaryRecords:
    """What a summary reads: the period's rows, the earlier rows that use up instruments before it, their
    sites, PUE records and factors, and the organization's instruments."""

    rows: list[HourlyRollup]
    earlier: list[HourlyRollup]
    sites: dict[int, Site]  # of the period's rows
    all_sites: dict[int, Site]  # of the period's and the earlier rows
    pue: PueHistory
    factors: FactorSet
    instruments: list[co2e.Instrument]
    instrument_records: dict[str, ContractualInstrument]


def _summary_records(organization_id: int, start: datetime, end: datetime) -> _SummaryRecords:
    rows = _rollups(organization_id, start, end)
    sites = {s.pk: s for s in Site.objects.filter(pk__in={r.site_id for r in rows if r.site_id})}
    instruments, instrument_records = instruments_of(organization_id)
    # Instruments are used up in chronological order: the rows since the earliest vintage still valid at the
    # start use up their share before the period's rows get theirs (market-based).
    counted_from = min([start, *(i.vintage_start for i in instruments if i.vintage_start < start)])
    earlier = _rollups(organization_id, counted_from, start) if counted_from < start else []
    # The period's sites, PUE records and factors listed in the summary are those of the period's own rows.
    all_sites = dict(sites)
    missing = {r.site_id for r in earlier if r.site_id and r.site_id not in all_sites}
    if missing:
        all_sites.update({s.pk: s for s in Site.objects.filter(pk__in=missing)})
    return _SummaryRecords(
        rows=rows,
        earlier=earlier,
        sites=sites,
        all_sites=all_sites,
        pue=PueHistory(all_sites),
        factors=factor_set({s.zone for s in all_sites.values()}, organization_id, counted_from, end),
        instruments=instruments,
        instrument_records=instrument_records,
    )


@dataclass
class _SummaryInputs:
    """The core's inputs made from rollups, the rows that could not be valued, and the PUE records used."""

    consumptions: list[co2e.Consumption] = field(default_factory=list)
    not_valued: list[dict[str, Any]] = field(default_factory=list)
    pue_used: dict[int, PueRecord] = field(default_factory=dict)


def _summary_inputs(rows: list[HourlyRollup], sites: dict[int, Site], pue: PueHistory) -> _SummaryInputs:
    inputs = _SummaryInputs()
    for row in rows:
        site = sites.get(row.site_id) if row.site_id is not None else None
        record = pue.at(site.pk, row.hour) if site is not None else None
        # A location-based failure stored on the row (no factor for the zone and hour, two versions that tie...)
        # would fail here too: the row is listed as not valued, with its reason, instead.
        location_error = bool(row.carbon_error) and not row.carbon_error.startswith(MARKET_ERROR_PREFIX)
        if site is None or record is None or row.energy_uj < 0 or location_error:
            inputs.not_valued.append(
                {"hour": row.hour, "model": row.model, "energy_uj": row.energy_uj, "why": row.carbon_error}
            )
            continue
        inputs.pue_used[record.pk] = record
        inputs.consumptions.append(rollup_consumption(row, site, record))
    return inputs


def _embodied_g(rows: list[HourlyRollup]) -> Decimal:
    """The embodied emissions of the rows' devices, each for the hours it has rows of the organization."""
    embodied = Decimal(0)
    device_ids = {r.device_id for r in rows if r.device_id}
    for device in Device.objects.filter(device_id__in=device_ids).exclude(embodied_kg_co2e=None):
        if device.lifetime_years is None:
            continue
        # The hours this device has rows of this organization (its requests, or its idle lines where the
        # organization operates the site): not every hour of the site, which other devices fill.
        reserved_hours = len({r.hour for r in rows if r.device_id == device.device_id})
        embodied += co2e.embodied_share_g(
            device.embodied_kg_co2e,
            device.lifetime_years * Decimal(365 * 24 * 3600),
            reserved_hours * 3600,
        )
    return embodied


def _sci(location: co2e.LocationResult, embodied_g: Decimal, requests: int) -> Decimal | None:
    """SCI = (E x I + M) / R with E x I the location-based CO2e of the hour slices (no instruments)."""
    return (location.total.co2e_g + embodied_g) / Decimal(requests) if requests else None


def _factor_records(
    location: co2e.LocationResult, market: co2e.MarketResult, factors: FactorSet
) -> dict[str, dict[str, Any]]:
    """The records of the factors either method used (the market-based one where it fell back on them)."""
    used = {use.factor.factor_id for use in location.factors_used}
    used |= {line.source_id for line in market.lines if line.source == "grid_average"}
    return {fid: factors.records[fid] for fid in used if fid in factors.records}


def _pue_record_lines(records: Iterable[PueRecord], sites: dict[int, Site]) -> list[dict[str, Any]]:
    return [
        {
            "id": r.pk,
            "site": sites[r.site_id].name,
            "valid_from": r.valid_from,
            "pue": r.pue,
            "source": r.source,
            "relative_uncertainty": r.relative_uncertainty,
        }
        for r in records
    ]


def _energy_uj_by_method(rows: list[HourlyRollup]) -> dict[str, int]:
    by_method: dict[str, int] = defaultdict(int)
    for row in rows:
        by_method[row.method] += row.energy_uj
    return dict(by_method)


def carbon_summary(organization_id: int, start: datetime, end: datetime) -> CarbonSummary:
    """Read the period's rollups and what values them, make the core's inputs, run both methods, and total."""
    records = _summary_records(organization_id, start, end)
    rows = records.rows
    counted = _summary_inputs(rows, records.all_sites, records.pue)
    # Earlier rows only use up instruments: what they cannot be valued for is not this period's concern.
    before = _summary_inputs(records.earlier, records.all_sites, records.pue).consumptions
    location = co2e.location_based(counted.consumptions, records.factors.all())
    market = co2e.market_based(
        before + counted.consumptions,
        records.instruments,
        residual_mixes_of(organization_id),
        records.factors.all(),
        count_from=start,
    )
    requests = sum(r.requests for r in rows)
    embodied = _embodied_g(rows)
    return CarbonSummary(
        organization_id=organization_id,
        start=start,
        end=end,
        requests=requests,
        energy_uj=sum(r.energy_uj for r in rows),
        idle_uj=sum(r.energy_uj for r in rows if r.kind == "idle"),
        energy_uj_by_method=_energy_uj_by_method(rows),
        measured_uj=sum(r.energy_uj for r in rows if r.measured),
        location=location,
        market=market,
        sci_g_per_request=_sci(location, embodied, requests),
        embodied_g=embodied,
        factor_records=_factor_records(location, market, records.factors),
        pue_records=_pue_record_lines(counted.pue_used.values(), records.sites),
        instruments=records.instrument_records,
        not_valued=counted.not_valued,
        rollup_rows=len(rows),
        rows={str(r.pk): r for r in rows},
        sites=records.sites,
        hourly_match=hourly_matching(counted.consumptions, records.instruments),
    )


ROLLUP_STEPS = ("hour", "day", "month")


def rollup_series(
    organization_id: int,
    start: datetime,
    end: datetime,
    step: str,
    *,
    model: str | None = None,
    site_id: int | None = None,
) -> list[dict[str, Any]]:
    """Totals per ``step`` (hour, day or month, UTC) over [start, end) from the hourly rollups: the series
    the dashboard's charts and the reports draw."""
    from django.db.models import F
    from django.db.models.functions import TruncDay, TruncMonth

    if step not in ROLLUP_STEPS:
        raise ValueError(f"step must be hour, day or month, got {step!r}")
    bucket = {"hour": F("hour"), "day": TruncDay("hour", tzinfo=UTC), "month": TruncMonth("hour", tzinfo=UTC)}
    rows = (
        rollups_of(organization_id, start, end, model=model, site_id=site_id)
        .annotate(t=bucket[step])
        .values("t")
        .order_by("t")
        .annotate(
            n=Sum("requests"),
            all_uj=Sum("energy_uj"),
            idle=Sum("energy_uj", filter=Q(kind="idle")),
            location=Sum("location_co2e_g"),
            market=Sum("market_co2e_g"),
        )
    )
    return [
        {
            "t": row["t"],
            "requests": row["n"] or 0,
            "energy_uj": row["all_uj"] or 0,
            "idle_uj": row["idle"] or 0,
            "location_co2e_g": row["location"] or Decimal(0),
            "market_co2e_g": row["market"] or Decimal(0),
        }
        for row in rows
    ]


# -- carbon-aware serving ----------------------------------------------------------------------------


@dataclass(frozen=True)
class GridSignal:
    """The grid intensity of a site's zone now and the threshold above which serving leans to efficiency."""

    zone: str
    intensity_g_per_kwh: Decimal | None
    intensity_source: str  # which figure: the hour's, the year's, or why none
    threshold_g_per_kwh: Decimal | None
    threshold_source: str

    @property
    def mode(self) -> str:
        if self.intensity_g_per_kwh is None or self.threshold_g_per_kwh is None:
            return "unknown"
        return "efficiency" if self.intensity_g_per_kwh > self.threshold_g_per_kwh else "normal"


def _percentile(values: list[Decimal], percent: int) -> Decimal:
    """Nearest-rank percentile: the smallest value with at least ``percent`` % of the values at or below it."""
    ordered = sorted(values)
    rank = max(1, -(-percent * len(ordered) // 100))
    return ordered[rank - 1]


@dataclass(frozen=True)
class ZoneForecast:
    """A provider's forecast intensity of one zone, per UTC hour, with what was tried to get it."""

    hours: dict[datetime, Decimal]
    provider: str  # the provider that answered; empty when none did
    source: str  # the provider's own source line of its readings
    notes: tuple[str, ...]  # each provider tried
    problems: tuple[str, ...] = ()  # why a provider gave nothing: shown with a signal that fell back


def provider_forecast(
    zone: str, start: datetime, end: datetime, providers: Sequence[IntensityProvider]
) -> ZoneForecast:
    """The first answer of ``providers`` (in order) for the forecast of ``zone`` over [start, end).

    A provider's failure is a note, never an error: callers fall back to the hourly series."""
    notes: list[str] = []
    problems: list[str] = []
    for provider in providers:
        name = str(getattr(provider, "name", type(provider).__name__))
        try:
            readings = provider.forecast(zone, start, end)
        except Exception as exc:  # a remote service: any failure means "no forecast from it"
            problems.append(f"the forecast of {name} failed ({exc}); the hourly series was used instead")
            notes.append(problems[-1])
            continue
        if readings:
            hours = {r.period_start: r.intensity_g_per_kwh for r in readings}
            notes.append(f"forecast of {name} for {len(hours)} hour(s) ({readings[0].source})")
            return ZoneForecast(hours, name, readings[0].source, tuple(notes), tuple(problems))
        problems.append(f"{name} gave no forecast for {zone}")
        notes.append(problems[-1])
    return ZoneForecast({}, "", "", tuple(notes), tuple(problems))


# (zone, hour) -> (monotonic time fetched, forecast): the gateway's signal refreshes every few minutes
# and the dashboard reads it on every load; a remote provider is asked at most once per
# CARBON_FORECAST_REFRESH_S per zone and hour (failures included, so a provider that is down does not
# slow every page).
_forecast_cache: dict[tuple[str, datetime], tuple[float, ZoneForecast]] = {}
_forecast_lock = threading.Lock()


def configured_forecast(zone: str, hour: datetime) -> ZoneForecast | None:
    """The forecast of ``zone`` from the configured providers (``INTENSITY_PROVIDERS``) for the 24 hours
    from ``hour``, cached; None when no provider is configured."""
    if not settings.INTENSITY_PROVIDERS:
        return None
    key = (zone, hour)
    now = time.monotonic()
    with _forecast_lock:
        cached = _forecast_cache.get(key)
        if cached is not None and now - cached[0] < settings.CARBON_FORECAST_REFRESH_S:
            return cached[1]
    try:
        providers = configured_providers()
    except ImproperlyConfigured as exc:
        why = (f"no forecast: {exc}",)
        forecast = ZoneForecast({}, "", "", notes=why, problems=why)
    else:
        forecast = provider_forecast(zone, hour, hour + FORECAST_HORIZON, providers)
    with _forecast_lock:
        for stale in [k for k in _forecast_cache if k[1] < hour]:
            del _forecast_cache[stale]
        _forecast_cache[key] = (now, forecast)
    return forecast


FORECAST_HORIZON = timedelta(hours=24)
_USE_CONFIGURED: Any = object()


def grid_signal(site: Any, now: datetime, *, forecast: ZoneForecast | None = _USE_CONFIGURED) -> GridSignal:
    """The site's carbon-aware state at ``now``: the intensity of the hour and the site's threshold, or the
    percentile (``carbon_threshold_percentile``, else ``CARBON_AWARE_PERCENTILE``) of the zone's hourly
    figures of the last 30 days together with the forecast hours of the next 24.

    The hour's intensity is the forecast's (``INTENSITY_PROVIDERS``, or ``forecast`` when given) when it
    covers the hour, else the hourly series', else the year's, as the inventory would choose it.
    """
    hour = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    zone = site.zone
    if forecast is _USE_CONFIGURED:
        forecast = configured_forecast(zone, hour)
    factors = factor_set([zone], site.organization_id, hour - timedelta(days=30), hour + timedelta(hours=1))
    intensity: Decimal | None = None
    forecast_note = "; ".join(forecast.problems) if forecast else ""
    if forecast is not None and hour in forecast.hours:
        intensity = forecast.hours[hour]
        intensity_source = (
            f"the forecast of {forecast.provider} for {hour:%Y-%m-%d %H}:00 UTC ({forecast.source})"
        )
    else:
        try:
            choice = co2e.select_factor(zone, hour, factors.candidates(zone, hour))
        except (co2e.NoFactor, co2e.AmbiguousFactor) as exc:
            intensity_source = f"no figure: {exc}"
        else:
            intensity = choice.factor.intensity_g_per_kwh
            intensity_source = {
                "hour": f"the hourly figure of {hour:%Y-%m-%d %H}:00 UTC",
                "year": f"the annual figure of {hour.year} (no hourly figure for this hour)",
            }.get(choice.match, f"the annual figure of {choice.factor.period_start.year} (nearest year)")
        if forecast_note:
            intensity_source = f"{intensity_source}; {forecast_note}"
    if site.carbon_threshold_g_per_kwh is not None:
        threshold: Decimal | None = Decimal(site.carbon_threshold_g_per_kwh)
        threshold_source = "the site's threshold"
    else:
        percent = site.carbon_threshold_percentile or settings.CARBON_AWARE_PERCENTILE
        recent = [
            f.intensity_g_per_kwh
            for (z, start), f in factors.hourly.items()
            if z == zone and hour - timedelta(days=30) <= start < hour
        ]
        ahead = (
            [v for h, v in forecast.hours.items() if hour <= h < hour + FORECAST_HORIZON] if forecast else []
        )
        figures = recent + ahead
        counted = f"{len(recent)} hourly figures of the last 30 days"
        if ahead:
            counted += f" and {len(ahead)} forecast hours of {forecast.provider if forecast else ''}"
        if len(figures) >= 24:
            threshold = _percentile(figures, percent)
            threshold_source = f"the {percent}th percentile of {counted}"
        else:
            threshold = None
            threshold_source = (
                f"unknown: {counted} (24 needed for a percentile); "
                "import an hourly series, configure a forecast provider or set the site's threshold"
            )
    return GridSignal(zone, intensity, intensity_source, threshold, threshold_source)


def instrument_summary(record: ContractualInstrument) -> dict[str, Any]:
    """An instrument as the API and the dashboard show it, with what keeps it from counting (if anything)."""
    hourly = hourly_volumes([record.pk]).get(record.pk)
    core = _core_instrument(record, hourly)
    problems = co2e.instrument_problems(core)
    return {
        "id": record.pk,
        "instrument_id": record.instrument_id,
        "kind": record.kind,
        "zone": record.zone,
        "vintage_start": record.vintage_start.isoformat(),
        "vintage_end": record.vintage_end.isoformat(),
        "mwh": record.mwh,
        "intensity_g_per_kwh": record.intensity_g_per_kwh,
        "certificate_ids": record.certificate_ids,
        "retirement_evidence": record.retirement_evidence,
        "quality_criteria": record.quality_criteria,
        "required_criteria": list(co2e.RELEVANT_CRITERIA[core.kind]),
        "hourly_matched": hourly is not None,
        "certificate_hours": 0 if hourly is None else len(hourly),
        "usable": not problems,
        "problems": list(problems),
        "notes": record.notes,
    }
