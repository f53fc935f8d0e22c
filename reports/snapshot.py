"""The frozen snapshot of a GHG report: every input it used and every number it prints.

Built once, at generation, from the rollups, factor versions, PUE records, instruments and the ledger's
verified chain heads; the files are rendered from the snapshot alone (:mod:`reports.render`), so rendering
the same snapshot again gives byte-identical CSV and JSON and the same numbers in the PDF. Numbers are
written as decimal strings, never floats.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import orjson

from carbon import co2e, display
from carbon.models import ContractualInstrument, FactorImport
from carbon.selectors import CarbonSummary, carbon_summary, factor_attributions, rollup_series
from ledger.archive import checkpoint
from ledger.models import LedgerChain, LedgerVerification
from ledger.selectors import organization_chains
from ledger.services import ledger_verify
from reports.esrs import esrs_e1
from reports.models import Report, ReportingProfile
from reports.synthetic import synthetic_statement
from tenancy.models import Organization

SCHEMA = "carbonledger.ghg-report/1"
STANDARD = "ISO 14064-1:2018 (quantification and reporting of GHG emissions at the organization level)"
# CO2e factors arrive already weighted by their publishers; this is the convention the report states.
GWP = {
    "source": "IPCC Sixth Assessment Report (AR6), WG I, Chapter 7, Table 7.15: 100-year GWP",
    "values": {"CO2": "1", "CH4 (fossil)": "29.8", "CH4 (non-fossil)": "27.0", "N2O": "273"},
    "note": (
        "Grid factors are published in CO2e by their sources (Ember/OWID, US EPA eGRID, Electricity Maps), "
        "each with its own GWP convention; they are used as published. Electricity use emits no GHG on site."
    ),
}
UNCERTAINTY_METHOD = (
    "IPCC 2006 Guidelines, Vol. 1, Ch. 3, Approach 1 (error propagation): relative uncertainties of metered "
    "energy, PUE and emission factor combine in quadrature per hour slice; slices of the same site, zone and "
    "category are treated as fully correlated; sites and categories combine in quadrature. 95 % intervals."
)
METHOD_WHY = {
    "nvml-counter": "measured: the GPU's cumulative energy counter read through NVML",
    "nvml-power-integration": "measured: NVML power samples integrated over time (no energy counter)",
    "rapl": "measured: the CPU package and DRAM energy counters (Intel RAPL, powercap)",
    "triton": "measured: a remote Triton server's nv_energy_consumption metric",
    "modelled": "modelled: process CPU time x declared TDP per core plus a memory term (no hardware counter)",
    "synthetic": "synthetic: generated demo traffic (demo/synthetic_ledger.py), no meter and no real device",
    "unknown": "the device is not known to the ledger",
}
# How a location-based factor matched the hour it valued, best first (co2e.FactorChoice.match).
MATCH_ORDER = ("hour", "year", "nearest_year")
MATCH_LABEL = {
    "hour": "hourly factor of the hour itself",
    "year": "annual factor of the same year",
    "nearest_year": "annual factor of the nearest year (none for the year itself)",
}
BIOGENIC_CO2 = (
    "Biogenic CO2: none is emitted or removed under the reporting boundary; the services burn no biomass and "
    "hold no biogenic carbon stock. Biogenic CO2 from biomass burnt in grid power plants arises upstream of "
    "the purchased electricity; the factor sources publish intensities without separating it, so it is "
    "neither quantified apart nor added to the totals (the statement ISO 14064-1:2018, 9.3.1, asks for)."
)
WHY_ONLY_CO2E = (
    "The emission factors of purchased electricity are published as CO2e per kWh, with no split by gas, so "
    "no per-gas figures (CO2, CH4, N2O) can be derived from them. No GHG is emitted on site: no fuel is "
    "burnt and no HFCs, PFCs, SF6 or NF3 are held or released under the boundary."
)
ReportProgress = Callable[[int, str], None]


class ReportFailure(Exception):
    """A report cannot be generated; the message is the readable reason shown to the user."""


def _s(value: Decimal) -> str:
    return format(value, "f")


def _g(value: Decimal) -> str:
    return _s(co2e.report_g(value))


def _t(value_g: Decimal) -> str:
    return _s(co2e.report_g(value_g).scaleb(-6))


def _kwh_from_uj(energy_uj: int | Decimal) -> str:
    return _s(co2e.report_kwh(Decimal(energy_uj).scaleb(-6) / co2e.J_PER_KWH))


def _total(total: co2e.Total) -> dict[str, str]:
    rounded = total.rounded()
    return {
        "facility_energy_kwh": _s(rounded.energy_kwh),
        "co2e_g": _s(rounded.co2e_g),
        "co2e_t": _s(rounded.co2e_g.scaleb(-6)),
        "uncertainty_g": _s(rounded.uncertainty_g),
        "relative_uncertainty": _s(rounded.relative_uncertainty),
    }


def code_version() -> str:
    """The running code's version: ``CARBONLEDGER_CODE_VERSION``, else the git commit, else ``unknown``."""
    pinned = os.environ.get("CARBONLEDGER_CODE_VERSION")
    if pinned:
        return pinned
    root = Path(__file__).resolve().parents[1]
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"git {done.stdout.strip()}"


def canonical_json(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)


def sha256_json(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def profile_of(organization: Organization) -> ReportingProfile:
    profile, _ = ReportingProfile.objects.get_or_create(organization=organization)
    return profile


# ---------------------------------------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------------------------------------


def build_snapshot(report: Report, progress: ReportProgress) -> dict[str, Any]:
    """Freeze everything the report prints. Raises :class:`ReportFailure` with a readable reason.

    Three steps: :func:`gather` reads the database, :func:`compute` derives the figures from what was read,
    :func:`format_snapshot` writes them as the dict the files are rendered from.
    """
    sources = gather(report, progress)
    return format_snapshot(sources, compute(sources))


# ---------------------------------------------------------------------------------------------------------
# Gather: every database read (and the ledger verification the report runs first)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainState:
    """A ledger chain holding the organization's records, with its latest verification and latest full one."""

    chain: LedgerChain
    latest: LedgerVerification | None
    last_full: LedgerVerification | None

    @property
    def problem(self) -> str:
        """What the latest verification, else the latest full one, found broken; empty when intact."""
        found = [v.problem for v in (self.latest, self.last_full) if v is not None and v.problem]
        return found[0] if found else ""


@dataclass(frozen=True)
class SnapshotSources:
    """Everything a snapshot is made from, as read at generation."""

    report: Report
    profile: ReportingProfile
    start: datetime
    end: datetime
    chains: list[ChainState]
    summary: CarbonSummary
    factor_imports: dict[int, FactorImport]
    instruments: list[ContractualInstrument]
    trend: list[dict[str, Any]]  # rollup_series points, by month, of the twelve months up to the period's end
    base: CarbonSummary | None  # the base year's inventory; None until a base year is chosen
    attribution: list[dict[str, str]]
    previous: Report | None  # the report whose stored snapshot the methodology is compared with
    generated_at: datetime
    code_version: str


def gather(report: Report, progress: ReportProgress) -> SnapshotSources:
    """Read what the snapshot needs, telling ``progress`` as each stage starts.

    Stops with :class:`ReportFailure` at the first input that rules the report out (a reversed period, a
    broken chain not accepted, emissions that cannot be computed): nothing after it is read.
    """
    org = report.organization
    profile = profile_of(org)
    start, end = _period(report)
    progress(15, "verifying the ledger's hash chains")
    chains = _verified_chains(org, start, end)
    _refuse_broken_chain(chains, accept_broken=report.accept_broken_chain)
    progress(35, "computing location- and market-based emissions")
    summary = _summary(org, start, end)
    progress(55, "collecting factors, PUE records, instruments and breakdowns")
    return SnapshotSources(
        report=report,
        profile=profile,
        start=start,
        end=end,
        chains=chains,
        summary=summary,
        factor_imports=_factor_imports(summary),
        instruments=list(ContractualInstrument.objects.filter(organization=org).order_by("instrument_id")),
        trend=rollup_series(org.pk, _trend_start(report.period_end), end, "month"),
        base=_base_year_summary(org, profile),
        # The organization's own factor imports (an hourly series it imported) are attributed too.
        attribution=factor_attributions(_factor_ids(summary), organization_id=org.pk),
        previous=_previous_report(report),
        generated_at=datetime.now(UTC),
        code_version=code_version(),
    )


def _period(report: Report) -> tuple[datetime, datetime]:
    start = datetime(report.period_start.year, report.period_start.month, report.period_start.day, tzinfo=UTC)
    end = datetime(report.period_end.year, report.period_end.month, report.period_end.day, tzinfo=UTC)
    if start >= end:
        raise ReportFailure(
            f"the period start {report.period_start} is not before its end {report.period_end}"
        )
    return start, end


def _verified_chains(organization: Organization, start: datetime, end: datetime) -> list[ChainState]:
    """Verify the ledger (what is new since the last verification), then read the chains holding the
    organization's records of the period: another organization's chains (their ids, heads, and whether they are
    intact) are none of this report's business, and the chains of other months would make the report's work
    grow with every chain the organization ever had."""
    ledger_verify()
    chains: list[ChainState] = []
    for chain in organization_chains(organization.pk, start, end):
        latest = LedgerVerification.objects.filter(chain=chain).order_by("-finished_at", "-id").first()
        # Full: from genesis, or from the chain's archive checkpoint (its records before it are in archive files).
        full_from = {0, checkpoint(chain)[0]}
        last_full = (
            LedgerVerification.objects.filter(chain=chain, from_seq__in=full_from)
            .order_by("-finished_at", "-id")
            .first()
        )
        chains.append(ChainState(chain=chain, latest=latest, last_full=last_full))
    return chains


def _refuse_broken_chain(chains: list[ChainState], *, accept_broken: bool) -> None:
    broken = [c for c in chains if c.problem]
    if broken and not accept_broken:
        first = broken[0]
        raise ReportFailure(
            f"the ledger chain {first.chain.chain_id} is broken ({first.problem}); the report is not generated "
            "unless it is asked for with accept_broken_chain"
        )


def _summary(organization: Organization, start: datetime, end: datetime) -> CarbonSummary:
    try:
        return carbon_summary(organization.pk, start, end)
    except (co2e.NoFactor, co2e.AmbiguousFactor, ValueError, TypeError, ArithmeticError) as exc:
        raise ReportFailure(f"the emissions cannot be computed: {exc}") from exc


def _factor_ids(summary: CarbonSummary) -> list[int]:
    return sorted(int(fid) for fid in summary.factor_records)


def _factor_imports(summary: CarbonSummary) -> dict[int, FactorImport]:
    """The versions (imports) of the factors the summary used, by id."""
    wanted = {r["factor_import_id"] for r in summary.factor_records.values()}
    return {i.pk: i for i in FactorImport.objects.filter(pk__in=wanted)}


def _month_start(day: date) -> datetime:
    return datetime(day.year, day.month, 1, tzinfo=UTC)


def _trend_start(period_end: date) -> datetime:
    """The start of the twelve calendar months that end with the period's last month."""
    trend_start = _month_start(period_end - timedelta(days=1))
    for _ in range(11):
        trend_start = _month_start((trend_start - timedelta(days=1)).date())
    return trend_start


def _previous_report(report: Report) -> Report | None:
    """The report this one is compared with for methodology changes: the one it replaces, else the
    organization's finished report with the latest earlier start (the latest generated of those)."""
    done = Report.objects.filter(status=Report.Status.DONE, snapshot__isnull=False).exclude(pk=report.pk)
    if report.replaces_id is not None:
        return done.filter(pk=report.replaces_id).first()
    return (
        done.filter(organization_id=report.organization_id, period_start__lt=report.period_start)
        .order_by("-period_start", "-finished_at", "-pk")
        .first()
    )


def _base_year_summary(organization: Organization, profile: ReportingProfile) -> CarbonSummary | None:
    # Unlike the period's own summary, a failure here is no ReportFailure: the run records an unexpected error.
    if profile.base_year is None:
        return None
    start = datetime(profile.base_year, 1, 1, tzinfo=UTC)
    end = datetime(profile.base_year + 1, 1, 1, tzinfo=UTC)
    return carbon_summary(organization.pk, start, end)


# ---------------------------------------------------------------------------------------------------------
# Compute: the figures, at full precision, from what was gathered (no database)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MethodShare:
    """IT energy metered by one method, and its share of all IT energy (None when there is none)."""

    method: str
    energy_uj: int
    share: Decimal | None


@dataclass
class BreakdownGroup:
    """Requests, energies and CO2e of both methods of one site x model x month x metering method."""

    site: str
    zone: str
    iso_category: str
    model: str
    month: str
    metering_method: str
    scope_category: str = ""  # "scope2", "scope3_cat1"; empty for energy at no site (not valued)
    requests: int = 0
    it_energy_uj: int = 0
    idle_energy_uj: int = 0
    facility_energy_kwh: Decimal = Decimal(0)
    location_co2e_g: Decimal = Decimal(0)
    market_co2e_g: Decimal = Decimal(0)
    rows: set[str] = field(default_factory=set)  # the rollup rows counted (by tag): each once


@dataclass(frozen=True)
class BaseYearFigures:
    """The base year's totals, for the comparison the report prints."""

    year: int
    location_co2e_g: Decimal
    market_co2e_g: Decimal
    requests: int
    location_g_per_1000_requests: Decimal | None


@dataclass(frozen=True)
class FactorMatchFigures:
    """The location-based lines valued by one kind of factor match ("hour", "year", "nearest_year")."""

    match: str
    energy_kwh: Decimal
    co2e_g: Decimal


@dataclass(frozen=True)
class DataQuality:
    """How much of the inventory rests on measurement, and on factors of the right time."""

    energy_uj: int
    measured_uj: int  # hardware counters (NVML, RAPL, a remote Triton)
    modelled_uj: int  # the CPU model: time x declared power
    factor_matches: list[FactorMatchFigures]
    facility_energy_kwh: Decimal
    measured_pue_energy_kwh: Decimal  # facility energy whose PUE was measured, not declared


@dataclass(frozen=True)
class SnapshotFigures:
    """What the snapshot states beyond the summary's own results."""

    ledger_intact: bool
    by_method: list[MethodShare]
    measured_share: Decimal | None  # None when there is no energy
    j_per_inference: Decimal | None  # None when there are no requests
    g_per_1000_requests: tuple[Decimal, Decimal] | None  # (location, market); None when there are no requests
    breakdown: list[BreakdownGroup]
    base_year: BaseYearFigures | None
    departures: list[str]
    factor_notes: list[str]
    data_quality: DataQuality


def compute(sources: SnapshotSources) -> SnapshotFigures:
    """The figures the snapshot prints beyond the summary's own, at full precision; rounding is the format's."""
    summary = sources.summary
    requests = summary.requests
    return SnapshotFigures(
        ledger_intact=all(not c.problem for c in sources.chains),
        by_method=[
            MethodShare(method, uj, Decimal(uj) / Decimal(summary.energy_uj) if summary.energy_uj else None)
            for method, uj in sorted(summary.energy_uj_by_method.items())
        ],
        measured_share=Decimal(summary.measured_uj) / Decimal(summary.energy_uj)
        if summary.energy_uj
        else None,
        j_per_inference=Decimal(summary.energy_uj - summary.idle_uj) / requests / 10**6 if requests else None,
        g_per_1000_requests=(
            summary.location.total.co2e_g * 1000 / requests,
            summary.market.total.co2e_g * 1000 / requests,
        )
        if requests
        else None,
        breakdown=_breakdown(summary),
        base_year=_base_year(sources.profile, sources.base),
        departures=_departures(sources.profile, summary),
        factor_notes=sorted({note for use in summary.location.factors_used for note in use.notes}),
        data_quality=_data_quality(summary),
    )


def _data_quality(summary: CarbonSummary) -> DataQuality:
    pue_source = {p["id"]: p["source"] for p in summary.pue_records}
    matches: dict[str, list[Decimal]] = {}
    facility_kwh = measured_pue_kwh = Decimal(0)
    for line in summary.location.lines:
        held = matches.setdefault(line.choice.match, [Decimal(0), Decimal(0)])
        held[0] += line.energy_kwh
        held[1] += line.co2e_g
        facility_kwh += line.energy_kwh
        row = summary.rows.get(line.consumption.tag)
        if row is not None and pue_source.get(row.pue_record_id) == "measured":
            measured_pue_kwh += line.energy_kwh
    return DataQuality(
        energy_uj=summary.energy_uj,
        measured_uj=summary.measured_uj,
        modelled_uj=summary.energy_uj_by_method.get("modelled", 0),
        factor_matches=[
            FactorMatchFigures(match, kwh, g)
            for match, (kwh, g) in sorted(matches.items(), key=lambda m: MATCH_ORDER.index(m[0]))
        ],
        facility_energy_kwh=facility_kwh,
        measured_pue_energy_kwh=measured_pue_kwh,
    )


def _breakdown(summary: CarbonSummary) -> list[BreakdownGroup]:
    """The result lines summed per site x model x month x metering method, in that order."""
    groups: dict[tuple[str, str, str, str], BreakdownGroup] = {}

    def group(tag: str) -> BreakdownGroup:
        row = summary.rows[tag]
        site = summary.sites.get(row.site_id) if row.site_id is not None else None
        key = (
            site.name if site is not None else "(no site)",
            row.model if row.kind == "request" else "(idle)",
            row.hour.astimezone(UTC).strftime("%Y-%m"),
            row.method,
        )
        held = groups.get(key)
        if held is None:
            held = groups[key] = BreakdownGroup(
                site=key[0],
                zone=site.zone if site is not None else "",
                iso_category=co2e.ISO_14064_CATEGORY[site.scope_category] if site is not None else "",
                model=key[1],
                month=key[2],
                metering_method=key[3],
                scope_category=site.scope_category if site is not None else "",
            )
        # A rollup row has several lines (an hour split over instruments and the residual mix): count it once.
        if tag not in held.rows:
            held.rows.add(tag)
            held.requests += row.requests
            held.it_energy_uj += row.energy_uj
            if row.kind == "idle":
                held.idle_energy_uj += row.energy_uj
        return held

    for line in summary.location.lines:
        held = group(line.consumption.tag)
        held.facility_energy_kwh += line.energy_kwh
        held.location_co2e_g += line.co2e_g
    for mline in summary.market.lines:
        group(mline.consumption.tag).market_co2e_g += mline.co2e_g
    return [groups[key] for key in sorted(groups)]


def _base_year(profile: ReportingProfile, base: CarbonSummary | None) -> BaseYearFigures | None:
    if profile.base_year is None or base is None:
        return None
    return BaseYearFigures(
        year=profile.base_year,
        location_co2e_g=base.location.total.co2e_g,
        market_co2e_g=base.market.total.co2e_g,
        requests=base.requests,
        location_g_per_1000_requests=base.location.total.co2e_g * 1000 / base.requests
        if base.requests
        else None,
    )


def _departures(profile: ReportingProfile, summary: CarbonSummary) -> list[str]:
    """Where the report departs from ISO 14064-1, each in a sentence."""
    departures: list[str] = []
    if not profile.responsible_person:
        departures.append(
            "No responsible person is named (§9.3.1 b); an admin names one in the dashboard's Settings."
        )
    if profile.base_year is None:
        departures.append("No base year has been chosen yet (§6.4.1); no base-year comparison is given.")
    lifecycle = [r for r in summary.factor_records.values() if r["basis"] == "lifecycle"]
    if lifecycle:
        departures.append(
            f"{len(lifecycle)} location-based factor(s) are lifecycle factors (upstream emissions included) where "
            "Category 2 calls for direct factors; they are labelled in the factor table."
        )
    if summary.not_valued:
        departures.append(
            f"{len(summary.not_valued)} hour(s) of energy could not be valued and are excluded from the totals: "
            + "; ".join(sorted({str(n["why"]) for n in summary.not_valued}))
        )
    return departures


# ---------------------------------------------------------------------------------------------------------
# Format: the snapshot dict, numbers as decimal strings
# ---------------------------------------------------------------------------------------------------------


def format_snapshot(sources: SnapshotSources, figures: SnapshotFigures) -> dict[str, Any]:
    """The snapshot as stored and rendered: every number a decimal string, rounded for the report."""
    report, profile = sources.report, sources.profile
    org = report.organization
    esrs = esrs_e1(sources.summary, sources.profile, sources.start, sources.end)
    inputs = _inputs(sources, esrs)
    snapshot = {
        "schema": SCHEMA,
        "report": {
            "id": report.pk,
            "kind": report.kind,
            "requested_by": report.requested_by,
            "replaces": report.replaces_id,
            "replacement_reason": report.replacement_reason,
        },
        "generated_at": sources.generated_at.isoformat(timespec="seconds"),
        "code_version": sources.code_version,
        "organization": {
            "slug": org.slug,
            "name": org.name,
            "description": profile.description or f"{org.name}: machine-learning inference services.",
            "responsible_person": profile.responsible_person or "not named",
        },
        "period": {
            "start": report.period_start.isoformat(),
            "end_exclusive": report.period_end.isoformat(),
            "last_day": (report.period_end - timedelta(days=1)).isoformat(),
            "label": display.period(report.period_start, report.period_end),
        },
        "boundaries": {
            "consolidation_approach": profile.consolidation_approach,
            "reporting_boundary": profile.reporting_boundary,
            "significance_threshold_percent": _s(profile.significance_threshold_percent),
            "sites": _sites(sources.summary),
        },
        "inputs": inputs,
        # What the figures are computed from, and only that: the same data gives the same hash. The ledger
        # verification each generation runs is reported beside it, in "ledger".
        "inputs_sha256": sha256_json(inputs),
        "ledger": _ledger(sources.chains, intact=figures.ledger_intact),
        "results": {
            **_results(sources, figures),
            "esrs_e1": esrs,
        },
        "statements": _statements(sources, figures),
    }
    snapshot["statements"]["methodology_changes"] = _methodology_changes(sources.previous, snapshot)
    return snapshot


def _sites(summary: CarbonSummary) -> list[dict[str, Any]]:
    return [
        {
            "name": site.name,
            "zone": site.zone,
            "electricity": site.electricity,
            "scope": "Scope 3, category 1" if site.scope_category == "scope3_cat1" else "Scope 2",
            "iso_category": co2e.ISO_14064_CATEGORY[site.scope_category],
            "devices": sorted({r.device_id for r in summary.rows.values() if r.site_id == site.pk}),
        }
        for site in sorted(summary.sites.values(), key=lambda s: s.name)
    ]


ROLLUP_COLUMNS = (
    "id",
    "site_id",
    "model",
    "kind",
    "metering_method",
    "measured",
    "hour",
    "requests",
    "it_energy_uj",
    "pue_record_id",
    "location_factor_id",
    "location_co2e_g_stored",
    "market_co2e_g_stored",
)


def _hourly_volumes(market: co2e.MarketResult) -> dict[str, dict[datetime, Decimal]]:
    """The hourly volumes (MWh per UTC hour) the market-based method was given, by instrument id: those of
    the instruments it applied and of those it excluded."""
    given = [u.instrument for u in market.instruments_used] + [e.instrument for e in market.excluded]
    return {i.instrument_id: dict(i.hourly_mwh) for i in given if i.hourly_mwh is not None}


def _inputs(sources: SnapshotSources, esrs: dict[str, Any]) -> dict[str, Any]:
    summary = sources.summary
    hourly = _hourly_volumes(summary.market)
    mix = esrs["energy_mix"]
    return {
        "rollups": [
            [
                int(r.pk),
                r.site_id,
                r.model,
                r.kind,
                r.method,
                r.measured,
                r.hour.astimezone(UTC).isoformat(),
                r.requests,
                r.energy_uj,
                r.pue_record_id,
                r.location_factor_id,
                None if r.location_co2e_g is None else _s(r.location_co2e_g),
                None if r.market_co2e_g is None else _s(r.market_co2e_g),
            ]
            for r in sorted(summary.rows.values(), key=lambda r: (r.hour, r.pk))
        ],
        "rollup_columns": list(ROLLUP_COLUMNS),
        "factors": _factors(summary, sources.factor_imports),
        # The generation mix the ESRS E1 energy split used: the file (by hash) and the shares of each zone.
        "generation_mix": {
            "file_sha256": mix["file_sha256"],
            "zones": [
                {
                    key: zone[key]
                    for key in (
                        "zone",
                        "mix_zone",
                        "year",
                        "fossil_share",
                        "nuclear_share",
                        "renewable_share",
                    )
                }
                for zone in mix["zones"]
            ],
        },
        "pue_records": [
            {
                "id": p["id"],
                "site": p["site"],
                "valid_from": p["valid_from"].isoformat(),
                "pue": _s(p["pue"]),
                "source": p["source"],
                "relative_uncertainty": _s(p["relative_uncertainty"]),
            }
            for p in sorted(summary.pue_records, key=lambda p: p["id"])
        ],
        "instruments": [
            _instrument(record, hourly.get(record.instrument_id)) for record in sources.instruments
        ],
    }


def _factors(summary: CarbonSummary, imports: dict[int, FactorImport]) -> list[dict[str, Any]]:
    factors: list[dict[str, Any]] = []
    for fid in _factor_ids(summary):
        record = summary.factor_records[str(fid)]
        factors.append(
            {
                "id": fid,
                "version": record["factor_import_id"],
                "version_name": imports[record["factor_import_id"]].name,
                "version_sha256": imports[record["factor_import_id"]].checksum_sha256,
                "zone": record["zone"],
                "zone_name": record["zone_name"],
                "granularity": record["granularity"],
                "period_start": record["period_start"].isoformat(),
                "year": record["period_start"].year,
                "intensity_g_per_kwh": _s(record["intensity_g_per_kwh"]),
                "basis": record["basis"],
                "gases": record["gases"],
                "source": record["source"],
                "licence": record["licence"],
                "url": record["url"],
                "published": record["published"],
                "estimated": record["estimated"],
                "relative_uncertainty": _s(record["relative_uncertainty"]),
            }
        )
    return factors


def _instrument(record: ContractualInstrument, hourly: dict[datetime, Decimal] | None) -> dict[str, Any]:
    return {
        "instrument_id": record.instrument_id,
        "kind": record.kind,
        "zone": record.zone,
        "vintage_start": record.vintage_start.isoformat(),
        "vintage_end": record.vintage_end.isoformat(),
        "mwh": None if record.mwh is None else _s(record.mwh),
        "intensity_g_per_kwh": _s(record.intensity_g_per_kwh),
        "certificate_ids": record.certificate_ids,
        "retirement_evidence": record.retirement_evidence,
        "quality_criteria": record.quality_criteria,
        # Granular certificates, by hash: every hour's volume moves a figure (market-based, hourly matching)
        # without changing the total.
        "hourly_volumes": None
        if hourly is None
        else {
            "hours": len(hourly),
            "mwh": _s(sum(hourly.values(), Decimal(0))),
            "sha256": sha256_json(
                [[hour.astimezone(UTC).isoformat(), _s(mwh)] for hour, mwh in sorted(hourly.items())]
            ),
        },
    }


def _ledger(chains: list[ChainState], *, intact: bool) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for state in chains:
        chain, latest, last_full = state.chain, state.latest, state.last_full
        rows.append(
            {
                "chain_id": chain.chain_id,
                "head_seq": chain.head_seq,
                "head_hash": chain.head_hash,
                "verified_to_seq": latest.seq if latest is not None else 0,
                "verified_at": latest.finished_at.isoformat() if latest is not None else None,
                "verified_from_seq_at_generation": latest.from_seq if latest is not None else 0,
                "last_full_verification_at": last_full.finished_at.isoformat() if last_full else None,
                "intact": not state.problem,
                "problem": state.problem,
            }
        )
    return {"chains": rows, "intact": intact, "accepted_broken": not intact}


def _results(sources: SnapshotSources, figures: SnapshotFigures) -> dict[str, Any]:
    summary = sources.summary
    return {
        "requests": summary.requests,
        "energy": _energy(summary, figures),
        "categories": [
            {
                "category": co2e.ISO_14064_CATEGORY[category],
                "ghg_protocol": "Scope 2 (purchased electricity)"
                if category == "scope2"
                else "Scope 3, category 1 (purchased goods and services: cloud inference)",
                "location_based": _total(summary.location.by_category[category]),
                "market_based": _total(summary.market.by_category[category]),
            }
            for category in co2e.SCOPE_CATEGORIES
        ],
        "scopes": _scopes(summary, figures),
        "location_based": _total(summary.location.total),
        "market_based": _market_based(summary.market),
        "intensity": _intensity(summary, figures),
        "breakdown": [_breakdown_row(group) for group in figures.breakdown],
        "monthly_trend": [
            {
                "month": point["t"].astimezone(UTC).strftime("%Y-%m"),
                "requests": point["requests"],
                "energy_kwh": _kwh_from_uj(point["energy_uj"]),
                "location_co2e_t": _t(point["location_co2e_g"]),
                "market_co2e_t": _t(point["market_co2e_g"]),
            }
            for point in sources.trend
        ],
        "base_year": _base_year_row(figures.base_year),
        "factor_notes": figures.factor_notes,
        "not_valued_hours": len(summary.not_valued),
        "data_quality": _data_quality_row(figures.data_quality, summary),
    }


SCOPE_LABELS = {
    "scope2": "Scope 2: owned and colocated sites",
    "scope3_cat1": "Scope 3 category 1: cloud inference",
}


def _scopes(summary: CarbonSummary, figures: SnapshotFigures) -> dict[str, Any]:
    """Each category on its own, with its sites: Scope 2 (ISO Category 2) is the owned and colocated sites
    only; cloud inference is Scope 3 category 1 (ISO Category 4)."""
    sites: dict[str, dict[str, dict[str, Any]]] = {category: {} for category in co2e.SCOPE_CATEGORIES}
    for group in figures.breakdown:
        if not group.scope_category:
            continue
        held = sites[group.scope_category].setdefault(
            group.site,
            {
                "kwh": Decimal(0),
                "location": Decimal(0),
                "market": Decimal(0),
                "zone": group.zone,
                "requests": 0,
            },
        )
        held["kwh"] += group.facility_energy_kwh
        held["location"] += group.location_co2e_g
        held["market"] += group.market_co2e_g
        held["requests"] += group.requests
    return {
        category: {
            "label": SCOPE_LABELS[category],
            "iso_category": co2e.ISO_14064_CATEGORY[category],
            "location_based": _total(summary.location.by_category[category]),
            "market_based": _total(summary.market.by_category[category]),
            "sites": [
                {
                    "site": name,
                    "zone": held["zone"],
                    "requests": held["requests"],
                    "facility_energy_kwh": _s(co2e.report_kwh(held["kwh"])),
                    "location_co2e_g": _g(held["location"]),
                    "market_co2e_g": _g(held["market"]),
                }
                for name, held in sorted(sites[category].items())
            ],
        }
        for category in co2e.SCOPE_CATEGORIES
    }


def _share(part: Decimal | int, whole: Decimal | int) -> str:
    if not whole:
        return "0"
    return _s((Decimal(part) / Decimal(whole)).quantize(Decimal("0.000001"), rounding=ROUND_HALF_EVEN))


def _data_quality_row(quality: DataQuality, summary: CarbonSummary) -> dict[str, Any]:
    total_g = sum((m.co2e_g for m in quality.factor_matches), Decimal(0))
    return {
        "measured_share": _share(quality.measured_uj, quality.energy_uj),
        "modelled_share": _share(quality.modelled_uj, quality.energy_uj),
        "other_share": _share(
            quality.energy_uj - quality.measured_uj - quality.modelled_uj, quality.energy_uj
        ),
        "factor_matches": [
            {
                "match": m.match,
                "label": MATCH_LABEL.get(m.match, m.match),
                "facility_energy_kwh": _s(co2e.report_kwh(m.energy_kwh)),
                "co2e_g": _g(m.co2e_g),
                "co2e_share": _share(m.co2e_g, total_g),
            }
            for m in quality.factor_matches
        ],
        "measured_pue_share": _share(quality.measured_pue_energy_kwh, quality.facility_energy_kwh),
        "relative_uncertainty": {
            "location_based": _s(co2e.report_relative(summary.location.total.relative_uncertainty)),
            "market_based": _s(co2e.report_relative(summary.market.total.relative_uncertainty)),
        },
        "not_valued_hours": len(summary.not_valued),
    }


def _energy(summary: CarbonSummary, figures: SnapshotFigures) -> dict[str, Any]:
    return {
        "it_energy_kwh": _kwh_from_uj(summary.energy_uj),
        "request_energy_kwh": _kwh_from_uj(summary.energy_uj - summary.idle_uj),
        "idle_energy_kwh": _kwh_from_uj(summary.idle_uj),
        "facility_energy_kwh": _s(co2e.report_kwh(summary.location.total.energy_kwh)),
        "by_metering_method": [
            {
                "method": m.method,
                "why": METHOD_WHY.get(m.method, m.method),
                "it_energy_kwh": _kwh_from_uj(m.energy_uj),
                "share": "0" if m.share is None else _s(co2e.report_relative(m.share)),
            }
            for m in figures.by_method
        ],
        "measured_share": "0"
        if figures.measured_share is None
        else _s(co2e.report_relative(figures.measured_share)),
        "j_per_inference": None
        if figures.j_per_inference is None
        else _s(figures.j_per_inference.quantize(Decimal("0.000001"))),
    }


DISCLOSURE_FORMATS: dict[co2e.QuantityKind, Callable[[Decimal], str]] = {
    "energy_kwh": display.energy_kwh,
    "intensity_g_per_kwh": display.intensity_g_per_kwh,
}


def _market_based(market: co2e.MarketResult) -> dict[str, Any]:
    return {
        **_total(market.total),
        "instruments_used": [
            {
                "instrument_id": u.instrument.instrument_id,
                "kind": u.instrument.kind,
                "covered_mwh": _s(co2e.report_kwh(u.covered_mwh)),
                "unused_mwh": None if u.unused_mwh is None else _s(co2e.report_kwh(u.unused_mwh)),
            }
            for u in market.instruments_used
        ],
        "excluded": [
            {"instrument_id": e.instrument.instrument_id, "reasons": list(e.reasons)} for e in market.excluded
        ],
        # Exact numbers (as the core holds them) for the JSON; the same sentences through the one number
        # formatter for the PDF.
        "disclosures": list(market.disclosures),
        "disclosures_display": [d.text(DISCLOSURE_FORMATS) for d in market.disclosures],
    }


def _intensity(summary: CarbonSummary, figures: SnapshotFigures) -> dict[str, Any]:
    per_1000 = figures.g_per_1000_requests
    sci = summary.sci_g_per_request
    return {
        "g_co2e_per_1000_inferences": {"location_g": None, "market_g": None}
        if per_1000 is None
        else {"location_g": _g(per_1000[0]), "market_g": _g(per_1000[1])},
        "sci_g_per_request": None if sci is None else _s(sci.quantize(Decimal("0.000000001"))),
        "sci_g_per_1000_requests": None if sci is None else _g(sci * 1000),
        "embodied_g": _g(summary.embodied_g),
        "sci_note": "SCI (ISO/IEC 21031:2024) = (E x I + M) / R with location-based hourly I, embodied M "
        "amortised over device lifetime by reserved hours; market instruments are not used in SCI.",
    }


def _breakdown_row(group: BreakdownGroup) -> dict[str, Any]:
    return {
        "site": group.site,
        "zone": group.zone,
        "iso_category": group.iso_category,
        "model": group.model,
        "month": group.month,
        "metering_method": group.metering_method,
        "requests": group.requests,
        "it_energy_kwh": _kwh_from_uj(group.it_energy_uj),
        "idle_energy_kwh": _kwh_from_uj(group.idle_energy_uj),
        "facility_energy_kwh": _s(co2e.report_kwh(group.facility_energy_kwh)),
        "location_co2e_g": _g(group.location_co2e_g),
        "market_co2e_g": _g(group.market_co2e_g),
    }


def _base_year_row(base: BaseYearFigures | None) -> dict[str, Any] | None:
    if base is None:
        return None
    return {
        "year": base.year,
        "location_co2e_t": _t(base.location_co2e_g),
        "market_co2e_t": _t(base.market_co2e_g),
        "requests": base.requests,
        "g_per_1000_requests_location": None
        if base.location_g_per_1000_requests is None
        else _g(base.location_g_per_1000_requests),
    }


def _statements(sources: SnapshotSources, figures: SnapshotFigures) -> dict[str, Any]:
    profile = sources.profile
    return {
        "standard": STANDARD,
        "departures": figures.departures,
        "verification_status": profile.verification_status,
        "gwp": GWP,
        "gases": _gases(sources.summary),
        "biogenic_co2": BIOGENIC_CO2,
        "uncertainty_method": UNCERTAINTY_METHOD,
        "base_year_policy": profile.recalculation_policy,
        "exclusions": _exclusions(profile),
        "quantification": (
            "Energy is metered per device and split over the requests of each batch (idle energy is booked "
            "separately); facility energy = IT energy x PUE of the site for the hour; location-based CO2e "
            "= facility energy x grid intensity of the site's zone for the hour (hourly series where "
            "imported, else the annual factor of the year, else the nearest year, flagged); market-based "
            "CO2e applies contractual instruments meeting the GHG Protocol Scope 2 Quality Criteria, then "
            "the residual mix (or the grid average, disclosed)."
        ),
        "attribution": sources.attribution,
        "synthetic_data": synthetic_statement(sources.summary),
    }


def _exclusions(profile: ReportingProfile) -> list[Any]:
    """The profile's exclusions, else the ones every inference service has."""
    return list(profile.exclusions) or [
        {
            "what": "Category 1 (direct emissions)",
            "justification": "inference services burn no fuel and hold no refrigerant under the boundary",
        },
        {
            "what": "Embodied emissions of hardware (Category 4, upstream)",
            "justification": "shown only inside SCI, not in the inventory totals; no supplier data per device",
        },
        {
            "what": "Network and client-device energy",
            "justification": "outside the reporting boundary; estimated below the "
            f"{display.percent_points(profile.significance_threshold_percent)} significance threshold",
        },
    ]


def _gases(summary: CarbonSummary) -> dict[str, Any]:
    by_source = sorted({(str(r["source"]), str(r["gases"])) for r in summary.factor_records.values()})
    reported = sorted({gases for _, gases in by_source}) or ["CO2e"]
    return {
        "reported": ", ".join(reported),
        "by_source": [{"source": source, "gases": gases} for source, gases in by_source],
        "gwp_source": GWP["source"],
        "why_only_co2e": WHY_ONLY_CO2E,
    }


# ---------------------------------------------------------------------------------------------------------
# Methodology changes: this snapshot against the previous report's stored one
# ---------------------------------------------------------------------------------------------------------

METHODOLOGY_SETS = {
    "factor_sources": "Emission factor sources",
    "factor_versions": "Emission factor versions",
    "factor_bases": "Emission factor bases",
    "metering_methods": "Metering methods",
    "sites": "Sites in the inventory",
}
METHODOLOGY_VALUES = {
    "gwp_source": "GWP source",
    "consolidation_approach": "Consolidation approach",
    "reporting_boundary": "Reporting boundary",
    "significance_threshold": "Significance threshold",
    "quantification": "Quantification method",
    "uncertainty_method": "Uncertainty method",
}


def methodology_of(snapshot: dict[str, Any]) -> dict[str, Any]:
    """What a snapshot says about its method, in a form two snapshots can be compared in. Reads only what
    every stored snapshot holds, so a report made by an earlier version compares too."""
    inputs = snapshot.get("inputs") or {}
    boundaries = snapshot.get("boundaries") or {}
    statements = snapshot.get("statements") or {}
    energy = (snapshot.get("results") or {}).get("energy") or {}
    factors = inputs.get("factors") or []
    pue: dict[str, set[str]] = {}
    for record in inputs.get("pue_records") or []:
        pue.setdefault(record["site"], set()).add(f"{display.number(record['pue'])} ({record['source']})")
    threshold = boundaries.get("significance_threshold_percent")
    return {
        "factor_sources": sorted({str(f["source"]) for f in factors}),
        "factor_versions": sorted({str(f["version_name"]) for f in factors}),
        "factor_bases": sorted({str(f["basis"]) for f in factors}),
        "metering_methods": sorted({str(m["method"]) for m in energy.get("by_metering_method") or []}),
        "sites": sorted(f"{s['name']} ({s['zone']}, {s['scope']})" for s in boundaries.get("sites") or []),
        "pue": {site: sorted(values) for site, values in sorted(pue.items())},
        "gwp_source": (statements.get("gwp") or {}).get("source", ""),
        "consolidation_approach": boundaries.get("consolidation_approach", ""),
        "reporting_boundary": boundaries.get("reporting_boundary", ""),
        "significance_threshold": "" if threshold is None else display.percent_points(threshold),
        "quantification": statements.get("quantification", ""),
        "uncertainty_method": statements.get("uncertainty_method", ""),
    }


def methodology_changes(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Each difference between two :func:`methodology_of` results, in a sentence."""
    changes: list[str] = []
    for key, label in METHODOLOGY_SETS.items():
        added = [v for v in now[key] if v not in before[key]]
        removed = [v for v in before[key] if v not in now[key]]
        parts = ([f"added {'; '.join(added)}"] if added else []) + (
            [f"no longer used: {'; '.join(removed)}"] if removed else []
        )
        if parts:
            changes.append(f"{label}: {'; '.join(parts)}.")
    for site in sorted(set(before["pue"]) & set(now["pue"])):
        if before["pue"][site] != now["pue"][site]:
            changes.append(
                f"PUE of site {site}: {', '.join(now['pue'][site])} "
                f"(previous report: {', '.join(before['pue'][site])})."
            )
    for key, label in METHODOLOGY_VALUES.items():
        if before[key] != now[key]:
            changes.append(f"{label}: {now[key]} (previous report: {before[key] or 'not stated'}).")
    return changes


def _methodology_changes(previous: Report | None, snapshot: dict[str, Any]) -> dict[str, Any]:
    if previous is None or not previous.snapshot:
        return {
            "previous_report": None,
            "summary": "There is no previous report of this organization to compare the methodology with.",
            "changes": [],
        }
    changes = methodology_changes(methodology_of(previous.snapshot), methodology_of(snapshot))
    label = display.period(previous.period_start, previous.period_end)
    return {
        "previous_report": {
            "id": previous.pk,
            "period_start": previous.period_start.isoformat(),
            "period_end_exclusive": previous.period_end.isoformat(),
            "label": label,
            "code_version": previous.code_version,
        },
        "summary": f"Compared with report {previous.pk} ({label}): "
        + (
            f"{len(changes)} change(s) of method or boundary."
            if changes
            else "no change of method or boundary."
        ),
        "changes": changes,
    }
