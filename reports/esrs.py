"""ESRS E1 datapoints of a report: E1-5 (energy consumption and mix of own operations) and E1-6 (gross Scopes
1, 2, 3 and total GHG emissions), each keyed by its disclosure and paragraph of ESRS E1 (Commission Delegated
Regulation (EU) 2023/2772), with the hourly-matched share of contracted carbon-free energy beside the annual
method (the GHG Protocol Scope 2 revision's proposal, not yet a standard).

Computed once, in the snapshot, from the carbon summary the report's own totals come from (same rounding, so
each ESRS figure equals the report's), the generation mix of each zone (the shipped public shares) and the
organization's net revenue; rendered as a JSON block (inside the snapshot), ``esrs-e1.csv`` and a PDF section
(``templates/reports/_esrs_e1.html``). Numbers are decimal strings, never floats.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Context, Decimal
from typing import Any, Final

from carbon import co2e, display
from carbon.energy_mix import GenerationMix, choose_mix
from carbon.selectors import CarbonSummary, generation_mixes
from reports.models import ReportingProfile

STANDARD: Final = "ESRS E1 Climate change (Commission Delegated Regulation (EU) 2023/2772)"
CSV_COLUMNS: Final = ("datapoint", "label", "value", "unit", "basis")
#: EFRAG IG 3 (List of ESRS datapoints) ids, as a public compilation of that list gives them.
IG3_SOURCE: Final = "EFRAG IG 3 List of ESRS Datapoints (ids as compiled in public listings of IG 3)"
HOURLY_LABEL: Final = (
    "Hourly matching: the GHG Protocol Scope 2 revision's proposal (public consultation), not yet a standard"
)
HOURLY_NOTE: Final = (
    "Share of own operations' electricity (Scope 2 sites, facility energy) covered in the same UTC hour by "
    "contracted carbon-free energy that carries hourly volumes (granular certificates), each hour at most the "
    "hour's volume. Carbon-free energy in the grid mix is not counted; certificates without hourly volumes are "
    "matched annually, as the market-based method does, and count only in the annual share."
)
# Instruments whose zero-emission attribute ESRS counts as renewable (E1-5 §37(c)(ii)); a supplier rate at
# 0 g/kWh may be nuclear, so it is split by the grid mix like uncovered electricity.
RENEWABLE_KINDS: Final = ("REC", "GO", "I-REC", "PPA")

_CTX: Final = Context(prec=50, rounding=ROUND_HALF_EVEN)
_MWH: Final = Decimal("0.000000001")  # 1 mWh: the kWh figures' 6 places, in MWh
_SHARE: Final = Decimal("0.0001")
_INTENSITY: Final = Decimal("0.000000001")
_KWH_PER_MWH: Final = Decimal(1000)


def _s(value: Decimal) -> str:
    return format(value, "f")


def _t(grams: Decimal) -> str:
    """t CO2e exactly as the report prints its totals: grams rounded to 0.001 g, in tonnes."""
    return _s(co2e.report_g(grams).scaleb(-6))


def _mwh(kwh: Decimal) -> Decimal:
    return _CTX.divide(kwh, _KWH_PER_MWH).quantize(_MWH, rounding=ROUND_HALF_EVEN)


@dataclass(frozen=True)
class _Revenue:
    """The period's net revenue in millions of the currency, and how it was found."""

    millions: Decimal
    currency: str
    basis: str


def _revenue(profile: ReportingProfile, start: datetime, end: datetime) -> _Revenue | None:
    if profile.net_revenue is None or profile.net_revenue_year is None:
        return None
    year = profile.net_revenue_year
    amount = Decimal(profile.net_revenue)
    days_in_year = (datetime(year + 1, 1, 1) - datetime(year, 1, 1)).days
    days = (end - start).days
    stated = f"net revenue of {year}: {amount:,.2f} {profile.net_revenue_currency}"
    if start.year == year and days == days_in_year and (start.month, start.day) == (1, 1):
        return _Revenue(_CTX.divide(amount, 10**6), profile.net_revenue_currency, stated)
    share = _CTX.divide(Decimal(days), Decimal(days_in_year))
    period = _CTX.multiply(amount, share)
    return _Revenue(
        _CTX.divide(period, 10**6),
        profile.net_revenue_currency,
        f"{stated}, pro-rated to the period's {days} of {days_in_year} days ({period:,.2f} "
        f"{profile.net_revenue_currency})",
    )


def _point(ig3: str, datapoint: str, label: str, value: str, unit: str, basis: str) -> dict[str, str]:
    return {
        "datapoint": datapoint,
        "ig3_id": ig3,
        "label": label,
        "value": value,
        "unit": unit,
        "basis": basis,
    }


@dataclass
class _Zone:
    energy_kwh: Decimal = Decimal(0)
    contracted_kwh: Decimal = Decimal(0)


def _zones(summary: CarbonSummary) -> dict[str, _Zone]:
    """Own operations' facility energy per zone and the part renewable instruments covered (kWh)."""
    zones: dict[str, _Zone] = defaultdict(_Zone)
    for line in summary.location.lines:
        if line.consumption.scope_category == "scope2":
            zone = zones[line.consumption.zone]
            zone.energy_kwh = _CTX.add(zone.energy_kwh, line.energy_kwh)
    renewable = {
        use.instrument.instrument_id
        for use in summary.market.instruments_used
        if use.instrument.kind in RENEWABLE_KINDS and use.instrument.intensity_g_per_kwh == 0
    }
    for market_line in summary.market.lines:
        if (
            market_line.source == "instrument"
            and market_line.source_id in renewable
            and market_line.consumption.scope_category == "scope2"
        ):
            zone = zones[market_line.consumption.zone]
            zone.contracted_kwh = _CTX.add(zone.contracted_kwh, market_line.energy_kwh)
    return dict(sorted(zones.items()))


def _carbon_free_kwh(summary: CarbonSummary) -> Decimal:
    """Own operations' energy covered by contracted carbon-free energy under the annual method (kWh)."""
    free = {
        u.instrument.instrument_id
        for u in summary.market.instruments_used
        if u.instrument.intensity_g_per_kwh == 0
    }
    total = Decimal(0)
    for line in summary.market.lines:
        if (
            line.source == "instrument"
            and line.source_id in free
            and line.consumption.scope_category == "scope2"
        ):
            total = _CTX.add(total, line.energy_kwh)
    return total


def esrs_e1(
    summary: CarbonSummary, profile: ReportingProfile, start: datetime, end: datetime
) -> dict[str, Any]:
    """The ESRS E1 block of the snapshot: datapoints, the energy mix used, the hourly matching, notes."""
    mixes, mix_sha256 = generation_mixes()
    zones = _zones(summary)
    own = summary.location.by_category["scope2"]
    total_kwh = co2e.report_kwh(own.energy_kwh)
    total_mwh = _mwh(total_kwh)
    fossil = nuclear = contracted = Decimal(0)
    mix_rows: list[dict[str, Any]] = []
    notes: list[str] = []
    used: dict[str, GenerationMix] = {}
    no_mix: list[str] = []
    for name, zone in zones.items():
        choice = choose_mix(name, mixes)
        rest = _CTX.subtract(zone.energy_kwh, zone.contracted_kwh)
        contracted = _CTX.add(contracted, zone.contracted_kwh)
        if choice.note:
            notes.append(
                choice.note
                + ("; its uncovered electricity is counted as fossil" if choice.mix is None else "")
            )
        if choice.mix is None:
            no_mix.append(name)
            fossil = _CTX.add(fossil, rest)
        else:
            used[choice.mix.zone] = choice.mix
            f, n, _ = choice.mix.fractions()
            fossil = _CTX.add(fossil, _CTX.multiply(rest, f))
            nuclear = _CTX.add(nuclear, _CTX.multiply(rest, n))
        mix_rows.append(
            {
                "zone": name,
                "mix_zone": None if choice.mix is None else choice.mix.zone,
                "year": None if choice.mix is None else choice.mix.year,
                "fossil_share": None if choice.mix is None else _s(choice.mix.fossil_share),
                "nuclear_share": None if choice.mix is None else _s(choice.mix.nuclear_share),
                "renewable_share": None if choice.mix is None else _s(choice.mix.renewable_share),
                "facility_energy_mwh": _s(_mwh(zone.energy_kwh)),
                "contracted_renewable_mwh": _s(_mwh(zone.contracted_kwh)),
                "note": choice.note,
            }
        )
    fossil_mwh, nuclear_mwh = _mwh(fossil), _mwh(nuclear)
    # Rounded parts add up to the rounded total: renewable takes the remainder of the rounding.
    renewable_mwh = total_mwh - fossil_mwh - nuclear_mwh
    contracted_mwh = _mwh(contracted)
    revenue = _revenue(profile, start, end)
    points = _e1_5(total_mwh, fossil_mwh, nuclear_mwh, renewable_mwh, contracted_mwh, used, no_mix, revenue)
    points += _e1_6(summary, revenue, notes)
    attribution = [
        {"source": m.source, "licence": m.licence, "url": m.url}
        for m in sorted(
            {(m.source, m.licence, m.url): m for m in used.values()}.values(), key=lambda m: m.source
        )
    ]
    return {
        "standard": STANDARD,
        "ig3_source": IG3_SOURCE,
        "datapoints": points,
        "energy_mix": {"file_sha256": mix_sha256, "zones": mix_rows, "attribution": attribution},
        "hourly_matching": _hourly(summary, total_kwh),
        "notes": notes,
    }


def _e1_5(
    total: Decimal,
    fossil: Decimal,
    nuclear: Decimal,
    renewable: Decimal,
    contracted: Decimal,
    used: dict[str, GenerationMix],
    no_mix: list[str],
    revenue: _Revenue | None,
) -> list[dict[str, str]]:
    mixes = "; ".join(
        f"{m.zone} {m.year}: fossil {display.percent(m.fossil_share)}, nuclear {display.percent(m.nuclear_share)},"
        f" renewable {display.percent(m.renewable_share)}"
        for m in used.values()
    )
    split = (
        "electricity not covered by renewable contractual instruments, split by the generation mix of each "
        f"site's zone (location-based; {mixes or 'no mix used'})"
    )
    if no_mix:
        split += f"; zones without a published mix ({', '.join(no_mix)}) counted as fossil"
    shares: list[str] = ["", "", ""]
    if total:
        fossil_pct = _CTX.divide(fossil * 100, total).quantize(_SHARE)
        nuclear_pct = _CTX.divide(nuclear * 100, total).quantize(_SHARE)
        shares = [_s(fossil_pct), _s(nuclear_pct), _s(100 - fossil_pct - nuclear_pct)]
    share_basis = (
        "share of the total energy consumption (§37)" if total else "no energy consumed in the period"
    )
    intensity_value, intensity_basis, intensity_unit = (
        "",
        "not reported: no net revenue is configured",
        "MWh per million",
    )
    if revenue is not None:
        intensity_unit = f"MWh per million {revenue.currency}"
        intensity_value = _s(_CTX.divide(total, revenue.millions).quantize(_INTENSITY))
        intensity_basis = (
            f"total energy consumption (§37) per million {revenue.currency} of net revenue; {revenue.basis}. "
            "ESRS asks for it over the activities in high climate impact sectors; shown over all net revenue "
            "(AR 36)."
        )
    return [
        _point(
            "E1-5_01",
            "E1-5 §37",
            "Total energy consumption related to own operations",
            _s(total),
            "MWh",
            "facility energy (IT energy metered per device x PUE of the site for each hour) of the Scope 2 "
            "sites (ISO 14064-1 Category 2: owned and colocated); cloud inference (Scope 3 category 1) is not "
            "own operations and is excluded; electricity only, no fuel is burnt",
        ),
        _point(
            "E1-5_02",
            "E1-5 §37(a)",
            "Total energy consumption from fossil sources",
            _s(fossil),
            "MWh",
            split,
        ),
        _point(
            "E1-5_03",
            "E1-5 §37(b)",
            "Total energy consumption from nuclear sources",
            _s(nuclear),
            "MWh",
            split,
        ),
        _point(
            "E1-5_05",
            "E1-5 §37(c)",
            "Total energy consumption from renewable sources",
            _s(renewable),
            "MWh",
            "= (c)(i) + (c)(ii) + (c)(iii); the remainder of §37 after (a) and (b), so the rounded parts add up",
        ),
        _point(
            "E1-5_06",
            "E1-5 §37(c)(i)",
            "Fuel consumption for renewable sources",
            "0",
            "MWh",
            "no fuel is burnt under the reporting boundary",
        ),
        _point(
            "E1-5_07",
            "E1-5 §37(c)(ii)",
            "Consumption of purchased or acquired electricity, heat, steam and cooling from renewable sources",
            _s(renewable),
            "MWh",
            f"renewable electricity under contractual instruments ({', '.join(RENEWABLE_KINDS)} at 0 g CO2e/kWh "
            f"meeting the GHG Protocol Scope 2 Quality Criteria): {display.energy_kwh(contracted * _KWH_PER_MWH)}; "
            "plus the renewable "
            "share of the generation mix for the rest",
        ),
        _point(
            "E1-5_08",
            "E1-5 §37(c)(iii)",
            "Consumption of self-generated non-fuel renewable energy",
            "0",
            "MWh",
            "no energy is generated on site",
        ),
        _point(
            "E1-5_15",
            "E1-5 AR 34 (fossil)",
            "Share of fossil sources in total energy consumption",
            shares[0],
            "%",
            share_basis,
        ),
        _point(
            "E1-5_04",
            "E1-5 AR 34 (nuclear)",
            "Share of nuclear sources in total energy consumption",
            shares[1],
            "%",
            share_basis,
        ),
        _point(
            "E1-5_09",
            "E1-5 AR 34 (renewable)",
            "Share of renewable sources in total energy consumption",
            shares[2],
            "%",
            share_basis,
        ),
        _point(
            "E1-5_18",
            "E1-5 §40",
            "Energy intensity per net revenue",
            intensity_value,
            intensity_unit,
            intensity_basis,
        ),
    ]


def _e1_6(summary: CarbonSummary, revenue: _Revenue | None, notes: list[str]) -> list[dict[str, str]]:
    location, market = summary.location, summary.market
    scope2_lb = location.by_category["scope2"].co2e_g
    scope2_mb = market.by_category["scope2"].co2e_g
    scope3 = location.by_category["scope3_cat1"].co2e_g
    total_lb = location.total.co2e_g
    if market.by_category["scope3_cat1"].co2e_g == scope3:
        total_mb = market.total.co2e_g
    else:
        # ESRS has one Scope 3 figure, in both totals (AR 47); a residual mix for the cloud's zone makes the
        # inventory's own market-based total differ from it, so say so.
        total_mb = scope2_mb + scope3
        notes.append(
            "The inventory's market-based total values cloud electricity at the residual mix of its zone; ESRS "
            "has one Scope 3 figure, taken location-based, in both of its totals (§52), which therefore differ "
            "from the inventory's market-based total."
        )
    points = [
        _point(
            "E1-6_07",
            "E1-6 §48(a)",
            "Gross Scope 1 GHG emissions",
            "0",
            "t CO2e",
            "no direct emissions under the reporting boundary: no fuel is burnt and no refrigerant is held",
        ),
        _point(
            "E1-6_09",
            "E1-6 §49(a)",
            "Gross location-based Scope 2 GHG emissions",
            _t(scope2_lb),
            "t CO2e",
            "facility energy of the Scope 2 sites (ISO 14064-1 Category 2) x the location-based grid factor of "
            "their zone for each hour (hourly where imported, else annual)",
        ),
        _point(
            "E1-6_10",
            "E1-6 §49(b)",
            "Gross market-based Scope 2 GHG emissions",
            _t(scope2_mb),
            "t CO2e",
            "contractual instruments meeting the GHG Protocol Scope 2 Quality Criteria (those with hourly "
            "volumes matched hour by hour, the others over their vintage), then the residual mix, or the grid "
            "average where none is recorded (disclosed)",
        ),
        _point(
            "E1-6_11",
            "E1-6 §51",
            "Gross Scope 3 GHG emissions (category 1: purchased cloud inference)",
            _t(scope3),
            "t CO2e",
            "Scope 3 category 1 (ISO 14064-1 Category 4): facility energy of the cloud sites x the "
            "location-based grid factor of their region; the only Scope 3 category quantified under the boundary",
        ),
        _point(
            "E1-6_12",
            "E1-6 §52(a)",
            "Total GHG emissions (location-based)",
            _t(total_lb),
            "t CO2e",
            "= §48(a) + §49(a) + §51 (AR 47)",
        ),
        _point(
            "E1-6_13",
            "E1-6 §52(b)",
            "Total GHG emissions (market-based)",
            _t(total_mb),
            "t CO2e",
            "= §48(a) + §49(b) + §51 (AR 47)",
        ),
    ]
    for ig3, method, grams in (
        ("E1-6_30", "location-based", total_lb),
        ("E1-6_31", "market-based", total_mb),
    ):
        value, unit, basis = "", "t CO2e per million", "not reported: no net revenue is configured"
        if revenue is not None:
            tonnes = co2e.report_g(grams).scaleb(-6)
            value = _s(_CTX.divide(tonnes, revenue.millions).quantize(_INTENSITY))
            unit = f"t CO2e per million {revenue.currency}"
            basis = f"total GHG emissions ({method}, §52) per million {revenue.currency} of net revenue; {revenue.basis}"
        points.append(
            _point(
                ig3, f"E1-6 §53 ({method})", f"GHG intensity per net revenue ({method})", value, unit, basis
            )
        )
    return points


def _hourly(summary: CarbonSummary, total_kwh: Decimal) -> dict[str, Any]:
    matching = summary.hourly_match
    annual = hourly = ""
    if total_kwh:
        annual = _s(
            _CTX.divide(
                _carbon_free_kwh(summary), summary.location.by_category["scope2"].energy_kwh
            ).quantize(_SHARE)
        )
    if matching.share is not None:
        hourly = _s(matching.share.quantize(_SHARE, rounding=ROUND_HALF_EVEN))
    return {
        "label": HOURLY_LABEL,
        "note": HOURLY_NOTE,
        "annual_share": annual,
        "hourly_share": hourly,
        "consumption_mwh": _s(_mwh(total_kwh)),
        "matched_mwh": _s(_CTX.divide(matching.matched_j, co2e.J_PER_MWH).quantize(_MWH)),
        "instruments": list(matching.instruments),
        "hours": len(matching.hours),
        "hours_fully_matched": sum(1 for h in matching.hours if h.consumption_j and h.unmatched_j == 0),
    }


def render_esrs_csv(snapshot: dict[str, Any]) -> bytes:
    """``esrs-e1.csv``: one line per datapoint (``datapoint, label, value, unit, basis``), full precision."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for point in snapshot["results"]["esrs_e1"]["datapoints"]:
        writer.writerow([point[column] for column in CSV_COLUMNS])
    return out.getvalue().encode("utf-8")


def show(point: dict[str, str]) -> str:
    """A datapoint's value as a person reads it, through the one formatter (:mod:`carbon.display`)."""
    value, unit = point["value"], point["unit"]
    if value == "":
        return "not reported"
    if unit == "MWh":
        return display.energy_kwh(Decimal(value) * _KWH_PER_MWH)
    if unit == "t CO2e":
        return f"{display.mass_g(Decimal(value) * 10**6)} CO2e"
    if unit == "%":
        return display.percent_points(value)
    return f"{display.number(value)} {unit}"
