"""CO2e arithmetic (carbon.co2e): hand-computed cases from the shipped grid figures, market-based
instruments, SCI, IPCC Approach 1 uncertainty, and exactness properties. No Django, no database."""

from __future__ import annotations

import ast
import csv
import functools
import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carbon.co2e import (
    RELEVANT_CRITERIA,
    AmbiguousFactor,
    Consumption,
    Factor,
    Instrument,
    NoFactor,
    ResidualMix,
    embodied_share_g,
    location_based,
    market_based,
    relative_uncertainty_of_product,
    report_g,
    report_kwh,
    report_relative,
    report_uncertainty_g,
    sci_per_request,
    select_factor,
    split_by_hour,
    uncertainty_of_sum,
)

ROOT = Path(__file__).resolve().parents[2]
GRID = ROOT / "carbon" / "data" / "grid-intensity"  # the project's copy of the shared figures
MODULE = ROOT / "carbon" / "co2e.py"

KWH_J = Decimal("3600000")
# An illustrative residual mix, NOT a published figure (tests only need a number distinct from the grid average).
RESIDUAL_FR_2025 = Decimal("60")
Y2025 = datetime(2025, 1, 1, tzinfo=UTC)
Y2026 = datetime(2026, 1, 1, tzinfo=UTC)

FAST = settings(max_examples=60, deadline=None)


# ----------------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------------


@functools.cache
def _rows(name: str) -> tuple[dict[str, str], ...]:
    with (GRID / name).open(newline="", encoding="utf-8") as handle:
        return tuple(csv.DictReader(handle))


def rows(name: str) -> tuple[dict[str, str], ...]:
    return _rows(name)


def latest_row(name: str, zone: str) -> dict[str, str]:
    return max((r for r in rows(name) if r["zone"] == zone), key=lambda r: int(r["year"]))


def factor_from(name: str, row: dict[str, str], relative_uncertainty: str = "0.1") -> Factor:
    return Factor.annual(
        factor_id=f"{name}:{row['zone']}:{row['year']}",
        zone=row["zone"],
        year=int(row["year"]),
        intensity_g_per_kwh=Decimal(row["gco2e_per_kwh"]),
        basis=row["basis"],  # type: ignore[arg-type]
        source=row["source"],
        licence=row["license"],
        relative_uncertainty=Decimal(relative_uncertainty),
    )


def fr_2025() -> Factor:
    return factor_from("ember_owid_countries_latest.csv", latest_row("ember_owid_countries_latest.csv", "FR"))


def fr_2023() -> Factor:
    row = next(r for r in rows("owid_countries_2021_2023.csv") if r["zone"] == "FR")
    return factor_from("owid_countries_2021_2023.csv", row)


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def consumption(
    start: datetime,
    end: datetime,
    energy_j: Decimal,
    *,
    zone: str = "FR",
    site_id: str = "paris-1",
    pue: str = "1.0",
    pue_rel: str = "0",
    meter_rel: str = "0",
    category: str = "scope2",
) -> Consumption:
    return Consumption(
        site_id=site_id,
        zone=zone,
        start=start,
        end=end,
        energy_j=energy_j,
        pue=Decimal(pue),
        pue_relative_uncertainty=Decimal(pue_rel),
        meter_relative_uncertainty=Decimal(meter_rel),
        scope_category=category,  # type: ignore[arg-type]
    )


def instrument(
    instrument_id: str,
    kind: str = "REC",
    *,
    zone: str = "FR",
    mwh: str | None = "0.001",
    intensity: str = "0",
    start: datetime = Y2025,
    end: datetime = Y2026,
    **criteria: bool,
) -> Instrument:
    attested = dict.fromkeys(RELEVANT_CRITERIA[kind], True)  # type: ignore[index]
    attested.update(criteria)
    return Instrument(
        instrument_id=instrument_id,
        kind=kind,  # type: ignore[arg-type]
        zone=zone,
        vintage_start=start,
        vintage_end=end,
        mwh=None if mwh is None else Decimal(mwh),
        intensity_g_per_kwh=Decimal(intensity),
        quality_criteria=attested,
    )


def residual_fr_2025() -> ResidualMix:
    return ResidualMix(zone="FR", year=2025, intensity_g_per_kwh=RESIDUAL_FR_2025, source="illustrative")


def two_hours_in_paris() -> Consumption:
    """2 kWh of IT energy over 10:00-12:00 (1 kWh per hour), PUE 1.5: 3 kWh of facility electricity."""
    return consumption(at(2025, 6, 1, 10), at(2025, 6, 1, 12), 2 * KWH_J, pue="1.5")


# ----------------------------------------------------------------------------------------------------------------
# Location-based, hand-computed from the shipped figures
# ----------------------------------------------------------------------------------------------------------------


def test_one_kwh_in_france_at_pue_1_2_uses_the_latest_ember_figure() -> None:
    row = latest_row("ember_owid_countries_latest.csv", "FR")
    figure = Decimal(row["gco2e_per_kwh"])
    assert (row["year"], figure) == ("2025", Decimal("41.44")), (
        "shipped figure changed: redo the hand computation"
    )
    # 3.6 MJ / 3.6 MJ/kWh = 1 kWh of IT energy; x PUE 1.2 = 1.2 kWh; x 41.44 g/kWh = 49.728 g.
    used = consumption(at(2025, 6, 1, 10), at(2025, 6, 1, 10, 30), KWH_J, pue="1.2")

    result = location_based([used], [fr_2025()])

    assert result.total.energy_kwh == Decimal("1.2")
    assert result.total.co2e_g == Decimal("49.728")
    assert report_g(result.total.co2e_g) == Decimal("49.728")
    assert result.by_category["scope2"].co2e_g == Decimal("49.728")
    assert result.by_category["scope3_cat1"].co2e_g == 0
    (use,) = result.factors_used
    assert use.factor.factor_id == "ember_owid_countries_latest.csv:FR:2025"
    assert use.factor.licence == "CC BY 4.0"
    assert any("lifecycle basis" in note for note in use.notes)
    assert result.lines[0].choice.match == "year"
    assert not result.lines[0].choice.mismatch


def test_one_kwh_in_california_uses_the_egrid_2023_state_rate() -> None:
    row = latest_row("egrid2023_us_states.csv", "US-CA")
    figure = Decimal(row["gco2e_per_kwh"])
    assert (row["year"], figure) == ("2023", Decimal("179.064")), (
        "shipped figure changed: redo the hand computation"
    )
    # 1 kWh x PUE 1.0 x 179.064 g/kWh (direct, eGRID2023 STC2ERTA) = 179.064 g, booked as cloud (Category 4).
    used = consumption(
        at(2023, 3, 1, 8), at(2023, 3, 1, 9), KWH_J, zone="US-CA", site_id="cloud-usw", category="scope3_cat1"
    )

    result = location_based([used], [factor_from("egrid2023_us_states.csv", row)])

    assert result.total.co2e_g == Decimal("179.064")
    assert result.by_category["scope3_cat1"].co2e_g == Decimal("179.064")
    assert result.by_category["scope2"].co2e_g == 0
    assert result.factors_used[0].factor.basis == "direct"
    assert result.factors_used[0].notes == ()


def test_hourly_factor_overrides_the_annual_one() -> None:
    hourly = Factor(
        factor_id="illustrative-FR-2025-06-01T10",
        zone="FR",
        period_start=at(2025, 6, 1, 10),
        period_end=at(2025, 6, 1, 11),
        granularity="hour",
        intensity_g_per_kwh=Decimal("25"),
        basis="direct",
        source="illustrative",
        licence="n/a",
        relative_uncertainty=Decimal("0.05"),
    )
    in_hour = consumption(at(2025, 6, 1, 10, 15), at(2025, 6, 1, 10, 45), KWH_J)
    next_hour = consumption(at(2025, 6, 1, 11, 15), at(2025, 6, 1, 11, 45), KWH_J)

    result = location_based([in_hour, next_hour], [fr_2025(), hourly])

    # 1 kWh x 25 g/kWh (hourly) + 1 kWh x 41.44 g/kWh (annual, no hourly figure for 11:00) = 66.44 g
    assert [line.co2e_g for line in result.lines] == [Decimal("25"), Decimal("41.44")]
    assert result.total.co2e_g == Decimal("66.44")
    assert [line.choice.match for line in result.lines] == ["hour", "year"]
    assert any("no hourly factor for 2025-06-01T11:00" in note for note in result.lines[1].choice.notes)


def test_consumption_across_hours_gets_each_hours_factor() -> None:
    hourly = [
        Factor(
            factor_id=f"h{hour}",
            zone="FR",
            period_start=at(2025, 6, 1, hour),
            period_end=at(2025, 6, 1, hour + 1),
            granularity="hour",
            intensity_g_per_kwh=Decimal(intensity),
            basis="direct",
            source="illustrative",
            licence="n/a",
            relative_uncertainty=Decimal("0.05"),
        )
        for hour, intensity in ((10, "20"), (11, "40"))
    ]
    # 10:30-11:30, 2 kWh: 1 kWh in each hour -> 1 x 20 + 1 x 40 = 60 g
    result = location_based([consumption(at(2025, 6, 1, 10, 30), at(2025, 6, 1, 11, 30), 2 * KWH_J)], hourly)

    assert result.total.co2e_g == Decimal("60")
    assert [u.factor.factor_id for u in result.factors_used] == ["h10", "h11"]


def test_nearest_year_fallback_flags_the_mismatch() -> None:
    factors = [fr_2023(), fr_2025()]  # FR 2023 = 56.039 (OWID), FR 2025 = 41.44 (Ember)

    later = select_factor("FR", at(2026, 2, 1), factors)
    tie = select_factor("FR", at(2024, 7, 1), factors)
    earlier = select_factor("FR", at(2021, 7, 1), factors)

    assert later.factor.intensity_g_per_kwh == Decimal("41.44")
    assert later.mismatch and later.match == "nearest_year"
    assert any("annual factor for 2025 was used instead of 2026" in note for note in later.notes)
    # 2024 is one year from both 2023 and 2025: the earlier year wins the tie.
    assert tie.factor.intensity_g_per_kwh == Decimal("56.039")
    assert any("2023 was used instead of 2024" in note for note in tie.notes)
    assert earlier.factor.intensity_g_per_kwh == Decimal("56.039") and earlier.mismatch
    exact = select_factor("FR", at(2025, 7, 1), factors)
    assert exact.match == "year" and not exact.mismatch


def test_nearest_year_fallback_is_applied_by_location_based() -> None:
    used = consumption(at(2026, 2, 1, 10), at(2026, 2, 1, 11), KWH_J)

    result = location_based([used], [fr_2023(), fr_2025()])

    # 1 kWh x 41.44 g/kWh (the 2025 figure, for a 2026 consumption)
    assert result.total.co2e_g == Decimal("41.44")
    assert any("instead of 2026" in note for note in result.factors_used[0].notes)


def test_zone_without_factors_raises_no_factor() -> None:
    with pytest.raises(NoFactor) as caught:
        select_factor("XX", at(2025, 1, 1), [fr_2025()])
    assert caught.value.zone == "XX"
    with pytest.raises(NoFactor):
        location_based([consumption(at(2025, 6, 1, 10), at(2025, 6, 1, 11), KWH_J, zone="XX")], [fr_2025()])


def test_zone_with_only_other_hours_raises_no_factor() -> None:
    hourly = Factor(
        factor_id="h",
        zone="DE",
        period_start=at(2025, 6, 1, 10),
        period_end=at(2025, 6, 1, 11),
        granularity="hour",
        intensity_g_per_kwh=Decimal("300"),
        basis="direct",
        source="illustrative",
        licence="n/a",
        relative_uncertainty=Decimal("0"),
    )
    with pytest.raises(NoFactor, match="no annual factor"):
        select_factor("DE", at(2025, 6, 1, 12), [hourly])


def test_two_factors_for_the_same_zone_and_year_are_ambiguous() -> None:
    twin = Factor.annual(
        factor_id="other-FR-2025",
        zone="FR",
        year=2025,
        intensity_g_per_kwh=Decimal("30"),
        basis="direct",
        source="x",
        licence="x",
        relative_uncertainty=Decimal("0.1"),
    )
    with pytest.raises(AmbiguousFactor):
        select_factor("FR", at(2025, 3, 1), [fr_2025(), twin])


# ----------------------------------------------------------------------------------------------------------------
# Market-based
# ----------------------------------------------------------------------------------------------------------------


def test_valid_rec_covers_part_and_the_rest_goes_at_the_residual_mix() -> None:
    # Facility 3 kWh (1.5 kWh per hour). REC 0.001 MWh = 1 kWh at 0 g, applied to 10:00 first;
    # the remaining 2 kWh x 60 g/kWh (illustrative residual mix) = 120 g.
    result = market_based([two_hours_in_paris()], [instrument("REC-1")], [residual_fr_2025()], [fr_2025()])

    assert result.total.co2e_g == Decimal("120")
    assert result.total.energy_kwh == Decimal("3")
    assert result.covered_mwh == {"REC-1": Decimal("0.001")}
    assert result.instruments_used[0].unused_mwh == 0
    assert [(line.source, line.energy_kwh) for line in result.lines] == [
        ("instrument", Decimal("1")),
        ("residual_mix", Decimal("0.5")),
        ("residual_mix", Decimal("1.5")),
    ]
    assert result.excluded == ()


def test_count_from_lets_earlier_hours_use_up_instruments_without_counting_them() -> None:
    # The REC's 1 kWh goes to 10:00 (before the counted period); 11:00 is all residual mix: 1.5 x 60 = 90 g.
    result = market_based(
        [two_hours_in_paris()],
        [instrument("REC-1")],
        [residual_fr_2025()],
        [fr_2025()],
        count_from=at(2025, 6, 1, 11),
    )

    assert result.total.co2e_g == Decimal("90")
    assert result.total.energy_kwh == Decimal("1.5")
    assert result.covered_mwh == {"REC-1": Decimal("0")}
    assert result.instruments_used[0].unused_mwh == 0
    assert [(line.source, line.energy_kwh) for line in result.lines] == [("residual_mix", Decimal("1.5"))]


def test_instrument_failing_a_criterion_is_excluded_with_the_reason() -> None:
    failing = instrument("REC-double", unique_claim=False)
    unattested = Instrument(
        instrument_id="GO-bare",
        kind="GO",
        zone="FR",
        vintage_start=Y2025,
        vintage_end=Y2026,
        mwh=Decimal("1"),
        intensity_g_per_kwh=Decimal("0"),
        quality_criteria={"conveys_attributes": True},
    )

    result = market_based([two_hours_in_paris()], [failing, unattested], [residual_fr_2025()], [fr_2025()])

    # Nothing applied: 3 kWh x 60 g/kWh = 180 g
    assert result.total.co2e_g == Decimal("180")
    assert result.covered_mwh == {}
    by_id = {e.instrument.instrument_id: e.reasons for e in result.excluded}
    assert len(by_id["REC-double"]) == 1 and "'unique_claim' not met" in by_id["REC-double"][0]
    assert any("'retired_for_reporter' not attested" in r for r in by_id["GO-bare"])


def test_instrument_of_another_zone_or_vintage_is_not_applied() -> None:
    german = instrument("REC-DE", zone="DE")
    last_year = instrument("REC-2024", start=datetime(2024, 1, 1, tzinfo=UTC), end=Y2025)

    result = market_based([two_hours_in_paris()], [german, last_year], [residual_fr_2025()], [fr_2025()])

    assert result.total.co2e_g == Decimal("180")  # 3 kWh x 60 g/kWh
    assert result.covered_mwh == {"REC-2024": 0, "REC-DE": 0}
    assert all(use.unused_mwh == Decimal("0.001") for use in result.instruments_used)
    assert result.excluded == ()


def test_vintage_covers_only_the_hours_that_start_inside_it() -> None:
    from_eleven = instrument("REC-11h", mwh="1", start=at(2025, 6, 1, 11))

    result = market_based([two_hours_in_paris()], [from_eleven], [residual_fr_2025()], [fr_2025()])

    # 10:00 hour: 1.5 kWh x 60 = 90 g; 11:00 hour covered (1.5 kWh = 0.0015 MWh at 0 g)
    assert result.total.co2e_g == Decimal("90")
    assert result.covered_mwh == {"REC-11h": Decimal("0.0015")}


def test_no_residual_mix_falls_back_to_grid_average_with_a_disclosure() -> None:
    result = market_based([two_hours_in_paris()], [instrument("REC-1")], [], [fr_2025()])

    # 1 kWh covered; 2 kWh x 41.44 g/kWh (grid average) = 82.88 g
    assert result.total.co2e_g == Decimal("82.88")
    assert {line.source for line in result.lines} == {"instrument", "grid_average"}
    (disclosure,) = result.disclosures
    assert "No residual mix for zone FR in 2025" in disclosure
    assert "2.000000 kWh" in disclosure
    assert "ember_owid_countries_latest.csv:FR:2025" in disclosure
    assert "double counts" in disclosure


def test_residual_mix_without_stated_uncertainty_is_disclosed() -> None:
    result = market_based([two_hours_in_paris()], [], [residual_fr_2025()], [fr_2025()])

    assert any("states no uncertainty" in d for d in result.disclosures)


def test_supplier_rate_values_what_certificates_leave_at_its_rate() -> None:
    supplier = instrument("SUP-all", "supplier_rate", mwh=None, intensity="30")

    result = market_based(
        [two_hours_in_paris()], [supplier, instrument("REC-1")], [residual_fr_2025()], [fr_2025()]
    )

    # REC covers 1 kWh at 0 g; the unlimited supplier rate takes the other 2 kWh at 30 g/kWh = 60 g; no residual.
    assert result.total.co2e_g == Decimal("60")
    assert result.covered_mwh == {"REC-1": Decimal("0.001"), "SUP-all": Decimal("0.002")}
    assert "residual_mix" not in {line.source for line in result.lines}
    assert [u.unused_mwh for u in result.instruments_used] == [0, None]


def test_instruments_apply_in_order_ppa_supplier_rate_certificates() -> None:
    ppa = instrument("Z-PPA", "PPA")
    supplier = instrument("A-SUP", "supplier_rate", intensity="30")
    rec = instrument("B-REC", "REC")
    go = instrument("A-GO", "GO")
    used = consumption(at(2025, 6, 1, 10), at(2025, 6, 1, 11), Decimal("2.5") * KWH_J)

    result = market_based([used], [rec, go, supplier, ppa], [residual_fr_2025()], [fr_2025()])

    # 2.5 kWh: PPA 1 kWh (0 g), supplier 1 kWh (30 g), then certificates by id: GO "A-GO" 0.5 kWh, REC none.
    assert [u.instrument.instrument_id for u in result.instruments_used] == [
        "Z-PPA",
        "A-SUP",
        "A-GO",
        "B-REC",
    ]
    assert result.covered_mwh == {
        "Z-PPA": Decimal("0.001"),
        "A-SUP": Decimal("0.001"),
        "A-GO": Decimal("0.0005"),
        "B-REC": 0,
    }
    assert result.total.co2e_g == Decimal("30")


def test_supplier_rate_without_a_disclosed_rate_is_excluded() -> None:
    supplier = instrument("SUP", "supplier_rate", mwh=None, intensity="30", supplier_rate_disclosed=False)

    result = market_based([two_hours_in_paris()], [supplier], [residual_fr_2025()], [fr_2025()])

    assert result.total.co2e_g == Decimal("180")
    assert "supplier_rate_disclosed" in result.excluded[0].reasons[0]


def test_instruments_cover_only_scope2_unless_asked() -> None:
    cloud = consumption(
        at(2025, 6, 1, 10), at(2025, 6, 1, 11), KWH_J, site_id="cloud", category="scope3_cat1"
    )

    default = market_based([cloud], [instrument("REC-1")], [residual_fr_2025()], [fr_2025()])
    widened = market_based(
        [cloud],
        [instrument("REC-1")],
        [residual_fr_2025()],
        [fr_2025()],
        instrument_categories=("scope2", "scope3_cat1"),
    )

    assert default.by_category["scope3_cat1"].co2e_g == Decimal("60")
    assert any("not applied to scope3_cat1" in d for d in default.disclosures)
    assert widened.total.co2e_g == 0


# ----------------------------------------------------------------------------------------------------------------
# SCI
# ----------------------------------------------------------------------------------------------------------------


def test_sci_per_request_hand_computed() -> None:
    # M = 150 kg x 1 h / (4 x 365 x 24 h) = 150000 g / 35040 = 625/146 g = 4.28082191780821917808... g
    m = embodied_share_g(Decimal("150"), 4 * 365 * 24 * 3600, 3600)
    assert m.quantize(Decimal("1E-12")) == Decimal("4.280821917808")
    # E x I = 3.6 kJ = 0.001 kWh x 400 g/kWh = 0.4 g; SCI = (0.4 + 625/146) / 1000 = 683.4/146000
    #       = 0.004680821917808219... g/request
    sci = sci_per_request(Decimal("3600"), Decimal("400"), m, 1000)
    assert sci.quantize(Decimal("1E-15")) == Decimal("0.004680821917808")
    assert report_g(sci, Decimal("1E-6")) == Decimal("0.004681")


def test_embodied_share_scales_with_the_resource_share() -> None:
    # A quarter of an 800 kg device for half its lifetime: 800 000 g x 1/2 x 1/4 = 100 000 g
    assert embodied_share_g(Decimal("800"), 1000, 500, resource_share=Decimal("0.25")) == Decimal("100000")
    with pytest.raises(ValueError):
        embodied_share_g(Decimal("800"), 1000, 500, resource_share=Decimal("1.5"))
    with pytest.raises(ValueError):
        sci_per_request(Decimal("1"), Decimal("1"), Decimal("0"), 0)


# ----------------------------------------------------------------------------------------------------------------
# Uncertainty (IPCC 2006 Vol. 1 Ch. 3, Approach 1)
# ----------------------------------------------------------------------------------------------------------------


def test_relative_uncertainty_of_a_product_is_the_root_sum_of_squares() -> None:
    # sqrt(0.05^2 + 0.10^2 + 0.30^2) = sqrt(0.0025 + 0.01 + 0.09) = sqrt(0.1025) = 0.32015621187164...
    result = relative_uncertainty_of_product(Decimal("0.05"), Decimal("0.10"), Decimal("0.30"))
    assert result.quantize(Decimal("1E-12")) == Decimal("0.320156211872")
    assert abs(result * result - Decimal("0.1025")) < Decimal("1E-40")


def test_uncertainty_of_a_sum_adds_absolute_uncertainties_in_quadrature() -> None:
    # 100 g +/-10 % and 50 g +/-20 %: sqrt(10^2 + 10^2) = 14.1421356... g, / 150 g = 9.428...%
    absolute, relative = uncertainty_of_sum(
        [(Decimal("100"), Decimal("0.1")), (Decimal("50"), Decimal("0.2"))]
    )
    assert absolute.quantize(Decimal("1E-10")) == Decimal("14.1421356237")
    assert relative.quantize(Decimal("1E-10")) == Decimal("0.0942809042")
    assert uncertainty_of_sum([]) == (0, 0)


def test_location_result_reports_category_and_total_uncertainty() -> None:
    paris = consumption(
        at(2025, 6, 1, 10), at(2025, 6, 1, 11), KWH_J, pue="1.0", meter_rel="0.05", pue_rel="0.10"
    )
    cloud = consumption(
        at(2023, 6, 1, 10),
        at(2023, 6, 1, 11),
        KWH_J,
        zone="US-CA",
        site_id="cloud",
        category="scope3_cat1",
        meter_rel="0.05",
    )
    fr = factor_from("ember", latest_row("ember_owid_countries_latest.csv", "FR"), "0.30")
    ca = factor_from("egrid", latest_row("egrid2023_us_states.csv", "US-CA"), "0.10")

    result = location_based([paris, cloud], [fr, ca])

    paris_rel = relative_uncertainty_of_product(Decimal("0.05"), Decimal("0.10"), Decimal("0.30"))
    cloud_rel = relative_uncertainty_of_product(Decimal("0.05"), Decimal("0"), Decimal("0.10"))
    # (equal to the last of 50 significant digits: the relative figure is absolute / value, one more division)
    assert abs(result.by_category["scope2"].relative_uncertainty - paris_rel) < Decimal("1E-45")
    assert abs(result.by_category["scope3_cat1"].relative_uncertainty - cloud_rel) < Decimal("1E-45")
    expected_abs, expected_rel = uncertainty_of_sum(
        [(Decimal("41.44"), paris_rel), (Decimal("179.064"), cloud_rel)]
    )
    assert abs(result.total.uncertainty_g - expected_abs) < Decimal("1E-40")
    assert abs(result.total.relative_uncertainty - expected_rel) < Decimal("1E-40")
    rounded = result.total.rounded()
    assert rounded.co2e_g == Decimal("220.504")
    assert rounded.uncertainty_g >= result.total.uncertainty_g


def test_hour_slices_of_one_site_are_fully_correlated() -> None:
    long_run = consumption(
        at(2025, 6, 1, 0), at(2025, 6, 1, 12), 12 * KWH_J, meter_rel="0.05", pue_rel="0.10"
    )
    line_rel = relative_uncertainty_of_product(Decimal("0.05"), Decimal("0.10"), Decimal("0.1"))

    result = location_based([long_run], [fr_2025()])

    # 12 hour slices do not shrink the uncertainty by sqrt(12): same meter, PUE and factor throughout.
    assert len(result.lines) == 12
    assert abs(result.total.relative_uncertainty - line_rel) < Decimal("1E-45")


def test_market_result_reports_uncertainty() -> None:
    used = consumption(at(2025, 6, 1, 10), at(2025, 6, 1, 11), 2 * KWH_J, meter_rel="0.05")
    mix = ResidualMix(
        zone="FR",
        year=2025,
        intensity_g_per_kwh=RESIDUAL_FR_2025,
        source="x",
        relative_uncertainty=Decimal("0.2"),
    )

    result = market_based([used], [instrument("REC-1")], [mix], [fr_2025()])

    # 1 kWh x 60 g = 60 g with sqrt(0.05^2 + 0.2^2); the REC-covered kWh is 0 g and adds nothing.
    rel = relative_uncertainty_of_product(Decimal("0.05"), Decimal("0.2"))
    assert result.total.co2e_g == Decimal("60")
    assert abs(result.total.relative_uncertainty - rel) < Decimal("1E-45")
    assert report_uncertainty_g(result.total.uncertainty_g) == Decimal(
        "12.370"
    )  # 60 g x 0.206155... = 12.3693...
    assert not any("states no uncertainty" in d for d in result.disclosures)


# ----------------------------------------------------------------------------------------------------------------
# Rounding, validation, purity
# ----------------------------------------------------------------------------------------------------------------


def test_reporting_edge_rounds_half_even_and_uncertainty_up() -> None:
    assert report_g(Decimal("0.0125")) == Decimal("0.012")
    assert report_g(Decimal("0.0135")) == Decimal("0.014")
    assert report_kwh(Decimal("0.0000005")) == Decimal("0.000000")
    assert report_uncertainty_g(Decimal("0.0121")) == Decimal("0.013")
    assert report_relative(Decimal("0.32015")) == Decimal("0.3202")


def test_the_callers_tag_is_kept_on_every_slice_and_result_line() -> None:
    tagged = replace(two_hours_in_paris(), tag="row-7")
    assert {piece.tag for piece in split_by_hour(tagged)} == {"row-7"}
    result = location_based([tagged], [fr_2025()])
    assert [line.consumption.tag for line in result.lines] == ["row-7", "row-7"]


def test_split_by_hour_divides_in_proportion_to_time_with_the_remainder_last() -> None:
    # 10:30-12:15 = 30 + 60 + 15 min of 105: 7 J -> 2, 4, 1 J
    pieces = split_by_hour(consumption(at(2025, 6, 1, 10, 30), at(2025, 6, 1, 12, 15), Decimal("7")))
    assert [p.energy_j for p in pieces] == [2, 4, 1]
    assert [p.start for p in pieces] == [at(2025, 6, 1, 10, 30), at(2025, 6, 1, 11), at(2025, 6, 1, 12)]
    # 10:20-11:30 = 40 + 30 min of 70: 1 J x 4/7 = 0.571428571|428... floored to 1 nJ; the rest goes last
    first, last = split_by_hour(consumption(at(2025, 6, 1, 10, 20), at(2025, 6, 1, 11, 30), Decimal("1")))
    assert (first.energy_j, last.energy_j) == (Decimal("0.571428571"), Decimal("0.428571429"))


def test_inputs_are_validated() -> None:
    with pytest.raises(TypeError):
        consumption(at(2025, 1, 1), at(2025, 1, 1, 1), 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timezone-aware"):
        consumption(datetime(2025, 1, 1), at(2025, 1, 1, 1), KWH_J)
    with pytest.raises(ValueError, match="pue"):
        consumption(at(2025, 1, 1), at(2025, 1, 1, 1), KWH_J, pue="0.9")
    with pytest.raises(ValueError, match="start < end"):
        consumption(at(2025, 1, 1, 1), at(2025, 1, 1, 1), KWH_J)
    with pytest.raises(ValueError, match="mwh=None"):
        instrument("REC-all", mwh=None)
    with pytest.raises(ValueError, match="whole UTC hours"):
        instrument("REC-odd", start=at(2025, 1, 1, 0, 30))


def test_module_imports_only_the_standard_library() -> None:
    allowed = {"__future__", "collections", "dataclasses", "datetime", "decimal", "math", "typing"}
    tree = ast.parse(MODULE.read_text(encoding="utf-8"))
    imported = {
        name.split(".")[0]
        for node in ast.walk(tree)
        for name in (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    }
    assert imported <= allowed, imported - allowed


# ----------------------------------------------------------------------------------------------------------------
# Properties
# ----------------------------------------------------------------------------------------------------------------

energies = st.decimals(min_value=0, max_value=10**9, places=6, allow_nan=False, allow_infinity=False)
pues = st.decimals(min_value=1, max_value=3, places=3, allow_nan=False, allow_infinity=False)
YEAR_US = 365 * 24 * 3600 * 10**6


def _us(value: int) -> timedelta:
    return timedelta(microseconds=value)


@FAST
@given(
    offset=st.integers(0, YEAR_US),
    duration=st.integers(1, 50 * 3600 * 10**6),
    energy=st.decimals(min_value=0, max_value=10**9, places=12, allow_nan=False, allow_infinity=False),
)
def test_split_by_hour_conserves_energy_exactly(offset: int, duration: int, energy: Decimal) -> None:
    whole = consumption(Y2025 + _us(offset), Y2025 + _us(offset + duration), energy)

    pieces = split_by_hour(whole)

    assert sum((p.energy_j for p in pieces), Decimal(0)) == energy
    assert all(p.energy_j >= 0 for p in pieces)
    assert pieces[0].start == whole.start and pieces[-1].end == whole.end
    assert all(a.end == b.start for a, b in itertools.pairwise(pieces))
    assert all(p.end - p.start <= timedelta(hours=1) for p in pieces)
    assert all(
        p.start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1) >= p.end for p in pieces
    )


def _split(
    whole: Consumption, at_us: int, first_energy: Decimal, second_energy: Decimal
) -> list[Consumption]:
    middle = whole.start + _us(at_us)
    return [
        consumption(whole.start, middle, first_energy, pue=str(whole.pue)),
        consumption(middle, whole.end, second_energy, pue=str(whole.pue)),
    ]


@FAST
@given(
    offset=st.integers(0, 3 * YEAR_US),
    duration=st.integers(2, 30 * 3600 * 10**6),
    cut=st.floats(0, 1),
    first=energies,
    second=energies,
    pue=pues,
)
def test_splitting_a_consumption_never_changes_the_location_total(
    offset: int, duration: int, cut: float, first: Decimal, second: Decimal, pue: Decimal
) -> None:
    start = datetime(2024, 1, 1, tzinfo=UTC) + _us(offset)
    whole = consumption(start, start + _us(duration), first + second, pue=str(pue))
    at_us = min(max(1, int(cut * duration)), duration - 1)
    # One annual figure, used for every year through the nearest-year fallback: the factor is constant over the
    # span, so only the bookkeeping could change the total (and must not). Where the factor changes inside the
    # span, an arbitrary energy split legitimately moves emissions between factors.
    factors = [fr_2025()]

    assert (
        location_based([whole], factors).total
        == location_based(_split(whole, at_us, first, second), factors).total
    )


@FAST
@given(
    minute_us=st.integers(0, 3600 * 10**6 - 2), cut=st.floats(0, 1), first=energies, second=energies, pue=pues
)
def test_splitting_within_an_hour_never_changes_the_total_with_hourly_factors(
    minute_us: int, cut: float, first: Decimal, second: Decimal, pue: Decimal
) -> None:
    hour = at(2025, 6, 1, 10)
    hourly = Factor(
        factor_id="h10",
        zone="FR",
        period_start=hour,
        period_end=hour + timedelta(hours=1),
        granularity="hour",
        intensity_g_per_kwh=Decimal("23.7"),
        basis="direct",
        source="illustrative",
        licence="n/a",
        relative_uncertainty=Decimal("0.05"),
    )
    duration = 3600 * 10**6 - minute_us
    whole = consumption(hour + _us(minute_us), hour + timedelta(hours=1), first + second, pue=str(pue))
    at_us = min(max(1, int(cut * duration)), duration - 1)
    factors = [hourly, fr_2025()]

    assert (
        location_based([whole], factors).total
        == location_based(_split(whole, at_us, first, second), factors).total
    )


@FAST
@given(
    offset=st.integers(0, YEAR_US - 40 * 3600 * 10**6),
    duration=st.integers(2, 30 * 3600 * 10**6),
    cut=st.floats(0, 1),
    first=energies,
    second=energies,
    pue=pues,
    rec_mwh=st.decimals(min_value="0.000001", max_value=1, places=6),
)
def test_splitting_a_consumption_never_changes_the_market_total(
    offset: int, duration: int, cut: float, first: Decimal, second: Decimal, pue: Decimal, rec_mwh: Decimal
) -> None:
    start = Y2025 + _us(offset)
    whole = consumption(start, start + _us(duration), first + second, pue=str(pue))
    at_us = min(max(1, int(cut * duration)), duration - 1)
    instruments = [
        instrument("REC-1", mwh=str(rec_mwh)),
        instrument("SUP-1", "supplier_rate", mwh="0.0005", intensity="30"),
        instrument("REC-DE", zone="DE"),
    ]

    def total(consumptions: list[Consumption]) -> object:
        result = market_based(consumptions, instruments, [residual_fr_2025()], [fr_2025()])
        return result.total, result.covered_mwh

    assert total([whole]) == total(_split(whole, at_us, first, second))


@FAST
@given(
    st.lists(
        st.tuples(
            st.integers(0, YEAR_US),
            st.integers(1, 3 * 3600 * 10**6),
            energies,
            pues,
            st.sampled_from(["scope2", "scope3_cat1"]),
            st.sampled_from(["FR", "US-CA"]),
        ),
        max_size=6,
    )
)
def test_totals_are_never_negative(
    specs: list[tuple[int, int, Decimal, Decimal, str, str]],
) -> None:
    used = [
        consumption(
            Y2025 + _us(o),
            Y2025 + _us(o + d),
            e,
            pue=str(p),
            category=c,
            zone=z,
            site_id=z,
            meter_rel="0.05",
            pue_rel="0.1",
        )
        for o, d, e, p, c, z in specs
    ]
    factors = [fr_2025(), factor_from("egrid", latest_row("egrid2023_us_states.csv", "US-CA"))]

    location = location_based(used, factors)
    market = market_based(used, [instrument("REC-1")], [residual_fr_2025()], factors)

    for result in (location, market):
        for total in (result.total, *result.by_category.values()):
            assert total.co2e_g >= 0 and total.energy_kwh >= 0
            assert total.uncertainty_g >= 0 and total.relative_uncertainty >= 0
        assert all(line.co2e_g >= 0 for line in result.lines)
