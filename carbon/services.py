"""Writes of the carbon domain: factor imports (versions), residual mixes, instruments, sites and devices.

Factors, residual mixes and PUE records are never edited: a correction is a new record, and every result
names the records it used. After a write that changes what a past hour emitted (a factor import, a PUE
record, an instrument), the affected rollups' CO2e is recomputed by a Celery task queued on commit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from carbon import co2e
from carbon.certificate_csv import parse_certificates
from carbon.intensity_csv import (
    MAX_ERRORS_KEPT,
    IntensityImportError,
    IntensityRow,
    RowError,
    parse_intensity_bytes,
)
from carbon.models import (
    ContractualInstrument,
    EmissionFactor,
    FactorImport,
    InstrumentCertificate,
    PueRecord,
    ResidualMix,
)
from carbon.provider_config import configured_providers
from carbon.providers import IntensityProvider, ProviderError
from carbon.selectors import factor_owners
from tenancy.models import Device, Organization, Site
from tenancy.queue import task_named
from tenancy.services import ServiceError

SHIPPED_DIR = Path(__file__).resolve().parent / "data" / "grid-intensity"
SHIPPED_FILES = ("ember_owid_countries_latest.csv", "owid_countries_2021_2023.csv", "egrid2023_us_states.csv")
SHIPPED_BY = "shipped public figures"
_EPOCH = datetime(co2e.FIRST_YEAR, 1, 1, tzinfo=UTC)  # a site's first PUE record is valid from here
_CREATE_BATCH = 5000
# Residual mixes exist since attribute tracking does (the 1990s at the earliest): an earlier year is a typo.
# The last year is the one every stored date keeps to.
RESIDUAL_MIX_FIRST_YEAR = 1990


def _queue_recompute(
    organization_id: int | None,
    *,
    site_id: int | None = None,
    zone: str | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
) -> None:
    narrowed = {
        name: value
        for name, value in (
            ("site_id", site_id),
            ("zone", zone),
            ("start", start.isoformat() if start else None),
            ("end", end.isoformat() if end else None),
        )
        if value is not None
    }

    def queue() -> None:
        task_named("carbonledger.recompute_carbon").delay(organization_id, **narrowed)

    transaction.on_commit(queue)


def known_zones(organization: Organization | None = None) -> set[str]:
    """Zones ``organization`` may name: zones with a shared factor or one of its own imports, plus the
    zones of its own and of unowned sites. Another organization's private imports and sites stay private."""
    sites = Q(organization__isnull=True)
    if organization is not None:
        sites |= Q(organization=organization)
    owners = factor_owners(None if organization is None else organization.pk)
    zones = set(EmissionFactor.objects.filter(owners).values_list("zone", flat=True).distinct())
    zones.update(Site.objects.filter(sites).values_list("zone", flat=True))
    return zones


def _decimal(value: object, name: str, digits: tuple[int, int]) -> Decimal:
    """``value`` as a Decimal that fits its column (``digits`` = max digits, decimal places) exactly: a
    figure the database would round or refuse is refused here, by name."""
    try:
        result = Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        raise ServiceError(f"{name} must be a number, got {value!r}") from None
    if not result.is_finite():
        raise ServiceError(f"{name} must be a finite number, got {value!r}")
    max_digits, places = digits
    limit = Decimal(10) ** (max_digits - places)
    if abs(result) >= limit:
        raise ServiceError(f"{name} must be below {limit} in magnitude, got {value!r}")
    if result != result.quantize(Decimal(1).scaleb(-places)):
        raise ServiceError(f"{name} takes at most {places} decimal places, got {value!r}")
    return result


# -- factor imports ------------------------------------------------------------------------------


def factor_import_csv(
    *,
    data: bytes,
    name: str,
    organization: Organization | None = None,
    created_by: str = "",
    source: str | None = None,
    licence: str | None = None,
    url: str | None = None,
    allow_new_zones: bool = False,
    relative_uncertainty: Decimal | None = None,
) -> FactorImport:
    """Import a CSV of grid intensities as one new version, all or nothing.

    Returns the import record: ``accepted`` with its factors, or ``rejected`` with no factor and its first
    ``MAX_ERRORS_KEPT`` problems (line and reason) and their count (:func:`import_errors` reads both). A file
    already accepted for the same owner is refused (``ServiceError``) rather than imported twice.
    ``allow_new_zones`` accepts zones no factor or site has named yet.
    """
    checksum = hashlib.sha256(data).hexdigest()
    earlier = FactorImport.objects.filter(
        organization=organization, checksum_sha256=checksum, status=FactorImport.Status.ACCEPTED
    ).first()
    if earlier is not None:
        raise ServiceError(f"this file was already imported as version {earlier.pk} ({earlier.name})")
    uncertainty = (
        Decimal(str(settings.FACTOR_DEFAULT_RELATIVE_UNCERTAINTY))
        if relative_uncertainty is None
        else _decimal(relative_uncertainty, "relative_uncertainty", (6, 4))
    )
    if uncertainty < 0:
        raise ServiceError(f"relative_uncertainty must be >= 0, got {uncertainty}")
    zones: Collection[str] | None = None if allow_new_zones else known_zones(organization)
    try:
        parsed = parse_intensity_bytes(
            data,
            known_zones=zones,
            source=source,
            licence=licence,
            url=url,
            years=(co2e.FIRST_YEAR, co2e.LAST_YEAR),
        )
    except IntensityImportError as exc:
        return FactorImport.objects.create(
            organization=organization,
            name=name,
            layout="unknown",
            checksum_sha256=checksum,
            status=FactorImport.Status.REJECTED,
            errors=_stored_errors(exc),
            created_by=created_by,
        )
    with transaction.atomic():
        record = FactorImport.objects.create(
            organization=organization,
            name=name,
            layout=parsed.layout,
            checksum_sha256=checksum,
            status=FactorImport.Status.ACCEPTED,
            row_count=len(parsed.rows),
            created_by=created_by,
        )
        batch: list[EmissionFactor] = []
        for row in parsed.rows:
            batch.append(_factor(record, row, uncertainty))
            if len(batch) >= _CREATE_BATCH:
                EmissionFactor.objects.bulk_create(batch)
                batch = []
        EmissionFactor.objects.bulk_create(batch)
        _queue_recompute(None if organization is None else organization.pk)
    return record


def _stored_errors(exc: IntensityImportError) -> list[dict[str, Any]]:
    """The kept problems, then (when there were more) one entry with no line saying how many more: the
    import's ``errors`` column holds both without a schema change."""
    stored: list[dict[str, Any]] = [{"line": e.line, "reason": e.reason} for e in exc.errors]
    more = exc.count - len(exc.errors)
    if more > 0:
        stored.append(
            {"line": None, "reason": f"and {more} more problem(s), {exc.count} in all", "more": more}
        )
    return stored


def import_errors(record: FactorImport) -> tuple[list[dict[str, Any]], int]:
    """A rejected import's first ``MAX_ERRORS_KEPT`` problems (line and reason) and how many it had in all.
    Imports stored before the bound are cut on reading, so no answer repeats more."""
    kept: list[dict[str, Any]] = []
    total = 0
    for entry in record.errors or []:
        if isinstance(entry, dict) and entry.get("line") is None and "more" in entry:
            total += int(entry["more"])
            continue
        total += 1
        if len(kept) < MAX_ERRORS_KEPT:
            kept.append(entry)
    return kept, total


def _factor(record: FactorImport, row: IntensityRow, uncertainty: Decimal) -> EmissionFactor:
    return EmissionFactor(
        factor_import=record,
        zone=row.zone,
        zone_name=row.zone_name,
        granularity=row.granularity,
        period_start=row.period_start,
        period_end=row.period_end,
        intensity_g_per_kwh=row.intensity_g_per_kwh,
        basis=row.basis,
        gases=row.gases,
        source=row.source,
        licence=row.licence,
        url=row.url,
        published=row.published,
        estimated=row.estimated,
        relative_uncertainty=uncertainty,
    )


def load_shipped_factors() -> list[FactorImport]:
    """Import the public figures shipped in ``carbon/data/grid-intensity`` once; later calls do nothing.

    Safe to run twice (the checksum of each file identifies it); returns the imports made by this call.
    """
    made: list[FactorImport] = []
    for filename in SHIPPED_FILES:
        data = (SHIPPED_DIR / filename).read_bytes()
        checksum = hashlib.sha256(data).hexdigest()
        if FactorImport.objects.filter(
            organization=None, checksum_sha256=checksum, status=FactorImport.Status.ACCEPTED
        ).exists():
            continue
        record = factor_import_csv(
            data=data, name=f"shipped/{filename}", created_by=SHIPPED_BY, allow_new_zones=True
        )
        if record.status != FactorImport.Status.ACCEPTED:
            raise ServiceError(f"shipped file {filename} was rejected: {import_errors(record)[0][:3]}")
        made.append(record)
    return made


def residual_mix_create(
    *,
    zone: str,
    year: int,
    intensity_g_per_kwh: Decimal | str,
    source: str,
    licence: str = "",
    url: str = "",
    relative_uncertainty: Decimal | str = "0",
    organization: Organization | None = None,
) -> ResidualMix:
    """Record a residual-mix factor (a newer record for the same zone and year supersedes, never edits)."""
    intensity = _decimal(intensity_g_per_kwh, "intensity_g_per_kwh", (12, 6))
    if intensity < 0 or intensity > 2000:
        raise ServiceError(f"intensity_g_per_kwh must be between 0 and 2000, got {intensity}")
    uncertainty = _decimal(relative_uncertainty, "relative_uncertainty", (6, 4))
    if uncertainty < 0:
        raise ServiceError(f"relative_uncertainty must be >= 0, got {uncertainty}")
    if not zone.strip():
        raise ServiceError("zone is required")
    if not source.strip():
        raise ServiceError("source is required: a residual mix must name its publisher")
    if not RESIDUAL_MIX_FIRST_YEAR <= int(year) <= co2e.LAST_YEAR:
        raise ServiceError(f"year must be between {RESIDUAL_MIX_FIRST_YEAR} and {co2e.LAST_YEAR}, got {year}")
    with transaction.atomic():
        mix = ResidualMix.objects.create(
            organization=organization,
            zone=zone.strip(),
            year=int(year),
            intensity_g_per_kwh=intensity,
            source=source.strip(),
            licence=licence,
            url=url,
            relative_uncertainty=uncertainty,
        )
        _queue_recompute(None if organization is None else organization.pk)
    return mix


# -- contractual instruments ---------------------------------------------------------------------


def _aware(value: datetime, name: str) -> datetime:
    """``value`` in UTC, inside the years every stored date keeps to (co2e.FIRST_YEAR-LAST_YEAR)."""
    if timezone.is_naive(value):
        raise ServiceError(f"{name} must carry a time zone, got {value.isoformat()}")
    try:
        value = value.astimezone(UTC)
    except OverflowError:  # an offset that moves year 1 or 9999 past datetime's range
        raise ServiceError(
            f"{name} {value.isoformat()} is outside the years {co2e.FIRST_YEAR}-{co2e.LAST_YEAR}"
        ) from None
    problem = co2e.year_problem(value, name)
    if problem:
        raise ServiceError(problem)
    return value


def instrument_create(
    *,
    organization: Organization,
    instrument_id: str,
    kind: str,
    zone: str,
    vintage_start: datetime,
    vintage_end: datetime,
    mwh: Decimal | str | None,
    intensity_g_per_kwh: Decimal | str = "0",
    certificate_ids: str = "",
    retirement_evidence: str = "",
    quality_criteria: dict[str, Any] | None = None,
    notes: str = "",
    created_by: str = "",
) -> ContractualInstrument:
    """Record a contractual instrument. It is stored even when it fails a quality criterion: the
    market-based result then lists it as excluded, with the reason."""
    if kind not in ContractualInstrument.KINDS:
        raise ServiceError(f"kind must be one of {', '.join(ContractualInstrument.KINDS)}, got {kind!r}")
    if not instrument_id.strip():
        raise ServiceError("instrument_id is required")
    if ContractualInstrument.objects.filter(organization=organization, instrument_id=instrument_id).exists():
        raise ServiceError(f"an instrument '{instrument_id}' already exists in this organization")
    criteria = dict(quality_criteria or {})
    for key, value in criteria.items():
        if not isinstance(value, bool):
            raise ServiceError(f"quality criterion {key!r} must be true or false, got {value!r}")
    mwh_value = None if mwh in (None, "") else _decimal(mwh, "mwh", (16, 6))
    intensity = _decimal(intensity_g_per_kwh, "intensity_g_per_kwh", (12, 6))
    start, end = _aware(vintage_start, "vintage_start"), _aware(vintage_end, "vintage_end")
    # An instrument covers only the period it holds: a vintage of a year at most (the core excludes a longer
    # one stored before this check; here it is refused outright).
    vintage = co2e.vintage_problems(start, end) if start < end else ()
    if vintage:
        raise ServiceError("; ".join(vintage))
    try:  # the pure core holds the rules (whole hours, mwh > 0, only a supplier rate may be unlimited)
        co2e.Instrument(
            instrument_id=instrument_id,
            kind=kind,  # type: ignore[arg-type]
            zone=zone,
            vintage_start=start,
            vintage_end=end,
            mwh=mwh_value,
            intensity_g_per_kwh=intensity,
            quality_criteria=criteria,
        )
    except (ValueError, TypeError) as exc:
        raise ServiceError(str(exc)) from None
    with transaction.atomic():
        instrument = ContractualInstrument.objects.create(
            organization=organization,
            instrument_id=instrument_id.strip(),
            kind=kind,
            zone=zone.strip(),
            vintage_start=start,
            vintage_end=end,
            mwh=mwh_value,
            intensity_g_per_kwh=intensity,
            certificate_ids=certificate_ids,
            retirement_evidence=retirement_evidence,
            quality_criteria=criteria,
            notes=notes,
            created_by=created_by,
        )
        _queue_recompute(organization.pk)
    return instrument


class CertificateImportError(ServiceError):
    """An import of hourly certificates was refused as a whole; ``errors`` are its first problems (line and
    reason), ``count`` how many it has in all."""

    def __init__(self, error: IntensityImportError) -> None:
        self.errors = error.errors
        self.count = error.count
        shown = "; ".join(str(e) for e in error.errors[:5])
        more = f"; and {error.count - 5} more" if error.count > 5 else ""
        super().__init__(f"certificates rejected, nothing imported: {error.count} problem(s): {shown}{more}")


# The column's bound (max_digits 16, 6 places) on the instrument's MWh, which becomes the certificates' sum.
_MAX_INSTRUMENT_WH = 10**16 - 1


def instrument_certificates_import(
    *, instrument: ContractualInstrument, data: bytes, created_by: str = ""
) -> int:
    """Import granular (hourly) certificates of ``instrument`` from a CSV (:mod:`carbon.certificate_csv`),
    all or nothing; returns how many were imported.

    From then on the instrument is matched hour by hour: in each UTC hour it covers at most the energy of
    its certificates of that hour, and its ``mwh`` becomes the sum of all its certificates. Refused with
    :class:`CertificateImportError`, listing every problem by line: a bad row, an interval outside the
    instrument's vintage, a certificate id the instrument already holds."""
    try:
        rows = parse_certificates(data)
    except IntensityImportError as exc:
        raise CertificateImportError(exc) from None
    if not rows:
        raise ServiceError("the file holds no certificate")
    problems: list[RowError] = []
    # All of the instrument's ids (an IN list of a whole file's ids would pass SQLite's variable limit).
    held = set(
        InstrumentCertificate.objects.filter(instrument=instrument).values_list("certificate_id", flat=True)
    )
    for row in rows:
        if not instrument.vintage_start <= row.hour < instrument.vintage_end:
            problems.append(
                RowError(
                    row.line,
                    f"the hour {row.hour.isoformat()} is outside the vintage of {instrument.instrument_id}"
                    f" ({instrument.vintage_start.isoformat()} to {instrument.vintage_end.isoformat()})",
                )
            )
        if row.certificate_id in held:
            problems.append(
                RowError(
                    row.line, f"certificate {row.certificate_id!r} was already imported for this instrument"
                )
            )
    if problems:
        raise CertificateImportError(IntensityImportError(problems))
    with transaction.atomic():
        locked = ContractualInstrument.objects.select_for_update().get(pk=instrument.pk)
        earlier = InstrumentCertificate.objects.filter(instrument=locked).aggregate(wh=Sum("energy_wh"))["wh"]
        total_wh = (earlier or 0) + sum(r.energy_wh for r in rows)
        if total_wh > _MAX_INSTRUMENT_WH:
            raise ServiceError(f"the certificates of {locked.instrument_id} would sum to more than 10^10 MWh")
        if total_wh == 0:
            raise ServiceError("the certificates hold no energy: an instrument must cover more than 0 MWh")
        InstrumentCertificate.objects.bulk_create(
            [
                InstrumentCertificate(
                    instrument=locked,
                    certificate_id=r.certificate_id,
                    production_start=r.production_start,
                    production_end=r.production_end,
                    hour=r.hour,
                    energy_wh=r.energy_wh,
                    energy_source=r.energy_source,
                    created_by=created_by[:200],
                )
                for r in rows
            ],
            batch_size=_CREATE_BATCH,
        )
        locked.mwh = Decimal(total_wh).scaleb(-6)
        locked.save(update_fields=["mwh"])
        _queue_recompute(locked.organization_id)
    instrument.refresh_from_db()
    return len(rows)


# -- sites and devices ---------------------------------------------------------------------------


def _check_pue(pue: Decimal | str | float, uncertainty: Decimal | str | float) -> tuple[Decimal, Decimal]:
    value = _decimal(pue, "pue", (5, 3))
    if not Decimal(1) <= value <= Decimal(5):
        raise ServiceError(f"pue must be between 1 and 5, got {value}")
    relative = _decimal(uncertainty, "pue_relative_uncertainty", (6, 4))
    if not Decimal(0) <= relative < Decimal(1):
        raise ServiceError(f"pue_relative_uncertainty must be in [0, 1), got {relative}")
    return value, relative


def site_create(
    *,
    name: str,
    zone: str,
    pue: Decimal | str | float = "1",
    pue_source: str = "declared",
    pue_relative_uncertainty: Decimal | str | float = "0",
    electricity: str = Site.Electricity.OWNED,
    organization: Organization | None = None,
) -> Site:
    """Create a site with its first PUE record (valid from the beginning of the ledger)."""
    pue_value, relative = _check_pue(pue, pue_relative_uncertainty)
    if pue_source not in ("declared", "measured"):
        raise ServiceError(f"pue_source must be declared or measured, got {pue_source!r}")
    if electricity not in Site.Electricity.values:
        raise ServiceError(f"electricity must be one of {', '.join(Site.Electricity.values)}")
    if zone not in known_zones(organization):
        raise ServiceError(f"unknown grid zone {zone!r}: import a factor for it first")
    if organization is not None and name == settings.SITE_NAME:
        raise ServiceError(f"the site name '{name}' is reserved for the gateway's default site (SITE_NAME)")
    # Names are unique per organization: a clash with another organization's site is none of the caller's
    # business, and refusing it would tell them the name exists.
    if Site.objects.filter(name=name, organization=organization).exists():
        raise ServiceError(f"you already have a site named '{name}'")
    with transaction.atomic():
        site = Site(
            organization=organization,
            name=name,
            zone=zone,
            pue=pue_value,
            pue_source=pue_source,
            electricity=electricity,
        )
        site.full_clean()
        site.save()
        PueRecord.objects.create(
            site=site, valid_from=_EPOCH, pue=pue_value, source=pue_source, relative_uncertainty=relative
        )
    return site


def site_ensure_pue_record(site: Site) -> PueRecord:
    """The site's first PUE record, created from the site's own figure when it has none (sites made by the
    ledger writer for a new device)."""
    record = PueRecord.objects.filter(site=site).order_by("valid_from", "id").first()
    if record is None:
        record = PueRecord.objects.create(
            site=site,
            valid_from=_EPOCH,
            pue=site.pue,
            source=site.pue_source,
            note="from the site's settings",
        )
    return record


def site_set_pue(
    *,
    site: Site,
    pue: Decimal | str | float,
    source: str,
    valid_from: datetime,
    relative_uncertainty: Decimal | str | float = "0",
    note: str = "",
) -> PueRecord:
    """Append a PUE record from ``valid_from`` on; the rollups' CO2e from then on is recomputed."""
    value, relative = _check_pue(pue, relative_uncertainty)
    if source not in ("declared", "measured"):
        raise ServiceError(f"source must be declared or measured, got {source!r}")
    start = _aware(valid_from, "valid_from")
    with transaction.atomic():
        site_ensure_pue_record(site)
        record = PueRecord.objects.create(
            site=site, valid_from=start, pue=value, source=source, relative_uncertainty=relative, note=note
        )
        latest = PueRecord.objects.filter(site=site).order_by("-valid_from", "-id").first()
        if latest is not None and latest.pk == record.pk:
            site.pue, site.pue_source = value, source
            site.save(update_fields=["pue", "pue_source"])
        # Every organization with requests at the site (not only its operator), from the record's start.
        _queue_recompute(None, site_id=site.pk, start=start.replace(minute=0, second=0, microsecond=0))
    return record


def site_set_carbon_threshold(
    *,
    site: Site,
    threshold_g_per_kwh: Decimal | str | float | None = None,
    percentile: int | None = None,
) -> Site:
    """Set the intensity above which serving at the site leans to efficiency: a fixed threshold, or a
    percentile of the zone's last 30 days of hourly figures; neither: ``CARBON_AWARE_PERCENTILE``."""
    if threshold_g_per_kwh is not None and percentile is not None:
        raise ServiceError("give either threshold_g_per_kwh or percentile, not both")
    threshold = None
    if threshold_g_per_kwh is not None:
        threshold = _decimal(threshold_g_per_kwh, "threshold_g_per_kwh", (12, 6))
        if threshold < 0:
            raise ServiceError(f"threshold_g_per_kwh must be >= 0, got {threshold}")
    if percentile is not None and (isinstance(percentile, bool) or not 1 <= percentile <= 99):
        raise ServiceError(f"percentile must be an integer from 1 to 99, got {percentile!r}")
    site.carbon_threshold_g_per_kwh = threshold
    site.carbon_threshold_percentile = percentile
    site.save(update_fields=["carbon_threshold_g_per_kwh", "carbon_threshold_percentile"])
    return site


def device_update(
    *,
    device: Device,
    site: Site | None = None,
    embodied_kg_co2e: Decimal | str | None = None,
    lifetime_years: Decimal | str | None = None,
    idle_power_w: float | None = None,
) -> Device:
    """Place a device in a site and declare its embodied emissions and lifetime (for SCI)."""
    fields: list[str] = []
    if site is not None:
        device.site = site
        fields.append("site")
    if embodied_kg_co2e is not None:
        embodied = _decimal(embodied_kg_co2e, "embodied_kg_co2e", (12, 3))
        if embodied < 0:
            raise ServiceError(f"embodied_kg_co2e must be >= 0, got {embodied}")
        device.embodied_kg_co2e = embodied
        fields.append("embodied_kg_co2e")
    if lifetime_years is not None:
        lifetime = _decimal(lifetime_years, "lifetime_years", (6, 2))
        if lifetime <= 0:
            raise ServiceError(f"lifetime_years must be > 0, got {lifetime}")
        device.lifetime_years = lifetime
        fields.append("lifetime_years")
    if idle_power_w is not None:
        if idle_power_w < 0:
            raise ServiceError(f"idle_power_w must be >= 0, got {idle_power_w}")
        device.idle_power_w = idle_power_w
        fields.append("idle_power_w")
    if fields:
        # Placement applies to records rolled up from now on (and to all of them on a rebuild).
        device.save(update_fields=fields)
    return device


# -- online intensity providers (optional, off by default) ------------------------------------------


def intensity_fetch(
    *, providers: list[IntensityProvider] | None = None, zones: Collection[str] | None = None, hours: int = 48
) -> list[FactorImport]:
    """Fetch the last ``hours`` hours of average intensity of each site's zone from each provider, each
    answer a new factor version (unless identical to one already stored). Forecasts are never stored: the
    inventory uses observed history only. A provider failure is kept as a rejected import with its reason."""
    chosen = configured_providers() if providers is None else providers
    wanted = sorted(set(zones) if zones is not None else set(Site.objects.values_list("zone", flat=True)))
    end = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(hours=hours)
    made: list[FactorImport] = []
    for provider in chosen:
        for zone in wanted:
            name = f"{provider.name} {zone} {start:%Y-%m-%dT%H}Z..{end:%Y-%m-%dT%H}Z"
            try:
                readings = [r for r in provider.history(zone, start, end) if not r.forecast]
            except ProviderError as exc:
                made.append(
                    FactorImport.objects.create(
                        name=name,
                        layout=f"provider:{provider.name}",
                        checksum_sha256=hashlib.sha256(str(exc).encode()).hexdigest(),
                        status=FactorImport.Status.REJECTED,
                        errors=[{"line": 0, "reason": str(exc)}],
                        created_by="intensity_fetch",
                    )
                )
                continue
            # Only hours not stored yet, or revised since (a provider's estimate replaced by its measurement):
            # each hourly run would otherwise store again the 47 hours it stored an hour before.
            stored: dict[tuple[datetime, str], Decimal] = {}
            for period_start, basis, value in (
                EmissionFactor.objects.filter(
                    factor_import__organization=None,
                    factor_import__status=FactorImport.Status.ACCEPTED,
                    factor_import__layout=f"provider:{provider.name}",
                    zone=zone,
                    granularity="hour",
                    period_start__gte=start,
                    period_start__lt=end,
                )
                .order_by("factor_import_id")
                .values_list("period_start", "basis", "intensity_g_per_kwh")
            ):
                stored[(period_start, basis)] = value
            readings = [r for r in readings if stored.get((r.period_start, r.basis)) != r.intensity_g_per_kwh]
            if not readings:
                continue
            canonical = json.dumps(
                [[r.zone, r.period_start.isoformat(), str(r.intensity_g_per_kwh), r.basis] for r in readings]
            ).encode()
            checksum = hashlib.sha256(canonical).hexdigest()
            if FactorImport.objects.filter(
                organization=None, checksum_sha256=checksum, status=FactorImport.Status.ACCEPTED
            ).exists():
                continue
            uncertainty = Decimal(str(settings.FACTOR_DEFAULT_RELATIVE_UNCERTAINTY))
            with transaction.atomic():
                record = FactorImport.objects.create(
                    name=name,
                    layout=f"provider:{provider.name}",
                    checksum_sha256=checksum,
                    status=FactorImport.Status.ACCEPTED,
                    row_count=len(readings),
                    created_by="intensity_fetch",
                )
                EmissionFactor.objects.bulk_create(
                    EmissionFactor(
                        factor_import=record,
                        zone=r.zone,
                        granularity="hour",
                        period_start=r.period_start,
                        period_end=r.period_end,
                        intensity_g_per_kwh=r.intensity_g_per_kwh,
                        basis=r.basis,
                        source=f"{r.source} ({r.signal})",
                        licence=r.licence,
                        url=r.url,
                        estimated=r.estimated,
                        relative_uncertainty=uncertainty,
                    )
                    for r in readings
                )
                _queue_recompute(
                    None,
                    zone=zone,
                    start=min(r.period_start for r in readings),
                    end=max(r.period_end for r in readings),
                )
            made.append(record)
    return made
