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
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from carbonledger import co2e
from carbonledger.carbon.selectors import CarbonSummary, carbon_summary, factor_attributions, rollup_series
from carbonledger.models import (
    ChainOrganization,
    ContractualInstrument,
    FactorImport,
    LedgerChain,
    LedgerVerification,
    Organization,
)
from carbonledger.services import ledger_verify
from reports.models import Report, ReportingProfile

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
    "unknown": "the device is not known to the ledger",
}
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


def _ledger(report: Report, progress: ReportProgress) -> dict[str, Any]:
    progress(15, "verifying the ledger's hash chains")
    ledger_verify()
    chains = []
    # Only the chains holding the organization's records: another organization's chains (their ids, heads,
    # and whether they are intact) are none of this report's business.
    own = ChainOrganization.objects.filter(organization=report.organization).values("chain_id")
    for chain in LedgerChain.objects.filter(pk__in=own).order_by("chain_id"):
        latest = LedgerVerification.objects.filter(chain=chain).order_by("-finished_at", "-id").first()
        last_full = (
            LedgerVerification.objects.filter(chain=chain, from_seq=0).order_by("-finished_at", "-id").first()
        )
        broken = [v.problem for v in (latest, last_full) if v is not None and v.problem]
        chains.append(
            {
                "chain_id": chain.chain_id,
                "head_seq": chain.head_seq,
                "head_hash": chain.head_hash,
                "verified_to_seq": latest.seq if latest is not None else 0,
                "verified_at": latest.finished_at.isoformat() if latest is not None else None,
                "verified_from_seq_at_generation": latest.from_seq if latest is not None else 0,
                "last_full_verification_at": last_full.finished_at.isoformat() if last_full else None,
                "intact": not broken,
                "problem": broken[0] if broken else "",
            }
        )
    intact = all(c["intact"] for c in chains)
    if not intact and not report.accept_broken_chain:
        first = next(c for c in chains if not c["intact"])
        raise ReportFailure(
            f"the ledger chain {first['chain_id']} is broken ({first['problem']}); the report is not generated "
            "unless it is asked for with accept_broken_chain"
        )
    return {"chains": chains, "intact": intact, "accepted_broken": not intact}


def _breakdown(summary: CarbonSummary) -> list[dict[str, Any]]:
    """Per site x model x month x metering method: requests, energies and CO2e of both methods."""
    groups: dict[tuple[str, str, str, str], dict[str, Any]] = {}

    def group(tag: str) -> dict[str, Any]:
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
            held = groups[key] = {
                "site": key[0],
                "zone": site.zone if site is not None else "",
                "iso_category": co2e.ISO_14064_CATEGORY[site.scope_category] if site is not None else "",
                "model": key[1],
                "month": key[2],
                "metering_method": key[3],
                "requests": 0,
                "it_energy_uj": 0,
                "idle_energy_uj": 0,
                "facility_energy_kwh": Decimal(0),
                "location_co2e_g": Decimal(0),
                "market_co2e_g": Decimal(0),
                "_rows": set(),
            }
        if tag not in held["_rows"]:
            held["_rows"].add(tag)
            held["requests"] += row.requests
            held["it_energy_uj"] += row.energy_uj
            if row.kind == "idle":
                held["idle_energy_uj"] += row.energy_uj
        return held

    for line in summary.location.lines:
        held = group(line.consumption.tag)
        held["facility_energy_kwh"] += line.energy_kwh
        held["location_co2e_g"] += line.co2e_g
    for mline in summary.market.lines:
        group(mline.consumption.tag)["market_co2e_g"] += mline.co2e_g
    out = []
    for key in sorted(groups):
        held = groups[key]
        out.append(
            {
                "site": held["site"],
                "zone": held["zone"],
                "iso_category": held["iso_category"],
                "model": held["model"],
                "month": held["month"],
                "metering_method": held["metering_method"],
                "requests": held["requests"],
                "it_energy_kwh": _kwh_from_uj(held["it_energy_uj"]),
                "idle_energy_kwh": _kwh_from_uj(held["idle_energy_uj"]),
                "facility_energy_kwh": _s(co2e.report_kwh(held["facility_energy_kwh"])),
                "location_co2e_g": _g(held["location_co2e_g"]),
                "market_co2e_g": _g(held["market_co2e_g"]),
            }
        )
    return out


def _month_start(day: date) -> datetime:
    return datetime(day.year, day.month, 1, tzinfo=UTC)


def build_snapshot(report: Report, progress: ReportProgress) -> dict[str, Any]:
    """Freeze everything the report prints. Raises :class:`ReportFailure` with a readable reason."""
    org = report.organization
    profile = profile_of(org)
    start = datetime(report.period_start.year, report.period_start.month, report.period_start.day, tzinfo=UTC)
    end = datetime(report.period_end.year, report.period_end.month, report.period_end.day, tzinfo=UTC)
    if start >= end:
        raise ReportFailure(
            f"the period start {report.period_start} is not before its end {report.period_end}"
        )
    ledger = _ledger(report, progress)

    progress(35, "computing location- and market-based emissions")
    try:
        summary = carbon_summary(org.pk, start, end)
    except (co2e.NoFactor, co2e.AmbiguousFactor, ValueError, TypeError, ArithmeticError) as exc:
        raise ReportFailure(f"the emissions cannot be computed: {exc}") from exc

    progress(55, "collecting factors, PUE records, instruments and breakdowns")
    factor_ids = sorted(int(fid) for fid in summary.factor_records)
    imports = {
        i.pk: i
        for i in FactorImport.objects.filter(
            pk__in={r["factor_import_id"] for r in summary.factor_records.values()}
        )
    }
    factors = []
    for fid in factor_ids:
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
    factor_notes = sorted({note for use in summary.location.factors_used for note in use.notes})
    instruments = []
    for record in ContractualInstrument.objects.filter(organization=org).order_by("instrument_id"):
        instruments.append(
            {
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
            }
        )
    market = summary.market
    by_method: dict[str, int] = dict(sorted(summary.energy_uj_by_method.items()))
    methods = [
        {
            "method": method,
            "why": METHOD_WHY.get(method, method),
            "it_energy_kwh": _kwh_from_uj(uj),
            "share": _s(co2e.report_relative(Decimal(uj) / Decimal(summary.energy_uj)))
            if summary.energy_uj
            else "0",
        }
        for method, uj in by_method.items()
    ]
    sites = []
    for site in sorted(summary.sites.values(), key=lambda s: s.name):
        sites.append(
            {
                "name": site.name,
                "zone": site.zone,
                "electricity": site.electricity,
                "scope": "Scope 3, category 1" if site.scope_category == "scope3_cat1" else "Scope 2",
                "iso_category": co2e.ISO_14064_CATEGORY[site.scope_category],
                "devices": sorted({r.device_id for r in summary.rows.values() if r.site_id == site.pk}),
            }
        )
    trend_start = _month_start(report.period_end - timedelta(days=1))
    for _ in range(11):
        trend_start = _month_start((trend_start - timedelta(days=1)).date())
    trend = [
        {
            "month": point["t"].astimezone(UTC).strftime("%Y-%m"),
            "requests": point["requests"],
            "energy_kwh": _kwh_from_uj(point["energy_uj"]),
            "location_co2e_t": _t(point["location_co2e_g"]),
            "market_co2e_t": _t(point["market_co2e_g"]),
        }
        for point in rollup_series(org.pk, trend_start, end, "month")
    ]
    departures: list[str] = []
    if not profile.responsible_person:
        departures.append(
            "No responsible person is named in the organization's reporting profile (§9.3.1 b)."
        )
    if profile.base_year is None:
        departures.append("No base year has been chosen yet (§6.4.1); no base-year comparison is given.")
    lifecycle = [f for f in factors if f["basis"] == "lifecycle"]
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
    base_year: dict[str, Any] | None = None
    if profile.base_year is not None:
        by_start = datetime(profile.base_year, 1, 1, tzinfo=UTC)
        by_end = datetime(profile.base_year + 1, 1, 1, tzinfo=UTC)
        base = carbon_summary(org.pk, by_start, by_end)
        base_year = {
            "year": profile.base_year,
            "location_co2e_t": _t(base.location.total.co2e_g),
            "market_co2e_t": _t(base.market.total.co2e_g),
            "requests": base.requests,
            "g_per_1000_requests_location": _g(base.location.total.co2e_g * 1000 / base.requests)
            if base.requests
            else None,
        }
    requests = summary.requests
    per_1000 = (
        {
            "location_g": _g(summary.location.total.co2e_g * 1000 / requests),
            "market_g": _g(summary.market.total.co2e_g * 1000 / requests),
        }
        if requests
        else {"location_g": None, "market_g": None}
    )
    categories = []
    for category in co2e.SCOPE_CATEGORIES:
        categories.append(
            {
                "category": co2e.ISO_14064_CATEGORY[category],
                "ghg_protocol": "Scope 2 (purchased electricity)"
                if category == "scope2"
                else "Scope 3, category 1 (purchased goods and services: cloud inference)",
                "location_based": _total(summary.location.by_category[category]),
                "market_based": _total(market.by_category[category]),
            }
        )
    inputs = {
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
        "rollup_columns": [
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
        ],
        "factors": factors,
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
        "instruments": instruments,
        "ledger": ledger,
    }
    exclusions = list(profile.exclusions) or [
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
            "justification": f"outside the reporting boundary; estimated below the {profile.significance_threshold_percent} % "
            "significance threshold",
        },
    ]
    snapshot = {
        "schema": SCHEMA,
        "report": {
            "id": report.pk,
            "kind": report.kind,
            "requested_by": report.requested_by,
            "replaces": report.replaces_id,
            "replacement_reason": report.replacement_reason,
        },
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "code_version": code_version(),
        "organization": {
            "slug": org.slug,
            "name": org.name,
            "description": profile.description or f"{org.name}: machine-learning inference services.",
            "responsible_person": profile.responsible_person or "not named",
        },
        "period": {"start": report.period_start.isoformat(), "end_exclusive": report.period_end.isoformat()},
        "boundaries": {
            "consolidation_approach": profile.consolidation_approach,
            "reporting_boundary": profile.reporting_boundary,
            "significance_threshold_percent": _s(profile.significance_threshold_percent),
            "sites": sites,
        },
        "inputs": inputs,
        "inputs_sha256": sha256_json(inputs),
        "results": {
            "requests": requests,
            "energy": {
                "it_energy_kwh": _kwh_from_uj(summary.energy_uj),
                "request_energy_kwh": _kwh_from_uj(summary.energy_uj - summary.idle_uj),
                "idle_energy_kwh": _kwh_from_uj(summary.idle_uj),
                "facility_energy_kwh": _s(co2e.report_kwh(summary.location.total.energy_kwh)),
                "by_metering_method": methods,
                "measured_share": _s(
                    co2e.report_relative(Decimal(summary.measured_uj) / Decimal(summary.energy_uj))
                )
                if summary.energy_uj
                else "0",
                "j_per_inference": _s(
                    (Decimal(summary.energy_uj - summary.idle_uj) / requests / 10**6).quantize(
                        Decimal("0.000001")
                    )
                )
                if requests
                else None,
            },
            "categories": categories,
            "location_based": _total(summary.location.total),
            "market_based": {
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
                    {"instrument_id": e.instrument.instrument_id, "reasons": list(e.reasons)}
                    for e in market.excluded
                ],
                "disclosures": list(market.disclosures),
            },
            "intensity": {
                "g_co2e_per_1000_inferences": per_1000,
                "sci_g_per_request": None
                if summary.sci_g_per_request is None
                else _s(summary.sci_g_per_request.quantize(Decimal("0.000000001"))),
                "sci_g_per_1000_requests": None
                if summary.sci_g_per_request is None
                else _g(summary.sci_g_per_request * 1000),
                "embodied_g": _g(summary.embodied_g),
                "sci_note": "SCI (ISO/IEC 21031:2024) = (E x I + M) / R with location-based hourly I, embodied M "
                "amortised over device lifetime by reserved hours; market instruments are not used in SCI.",
            },
            "breakdown": _breakdown(summary),
            "monthly_trend": trend,
            "base_year": base_year,
            "factor_notes": factor_notes,
            "not_valued_hours": len(summary.not_valued),
        },
        "statements": {
            "standard": STANDARD,
            "departures": departures,
            "verification_status": profile.verification_status,
            "gwp": GWP,
            "uncertainty_method": UNCERTAINTY_METHOD,
            "base_year_policy": profile.recalculation_policy,
            "exclusions": exclusions,
            "quantification": (
                "Energy is metered per device and split over the requests of each batch (idle energy is booked "
                "separately); facility energy = IT energy x PUE of the site for the hour; location-based CO2e "
                "= facility energy x grid intensity of the site's zone for the hour (hourly series where "
                "imported, else the annual factor of the year, else the nearest year, flagged); market-based "
                "CO2e applies contractual instruments meeting the GHG Protocol Scope 2 Quality Criteria, then "
                "the residual mix (or the grid average, disclosed)."
            ),
            "attribution": factor_attributions([f["id"] for f in factors]),
        },
    }
    return snapshot
