"""Hourly matching (carbon.hourly and the hourly volumes of carbon.co2e instruments): hand-computed cases and
properties of the exact arithmetic. No Django, no database."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from carbon.co2e import (
    J_PER_KWH,
    J_PER_MWH,
    RELEVANT_CRITERIA,
    Consumption,
    Instrument,
    ResidualMix,
    market_based,
    split_by_hour,
)
from carbon.hourly import hourly_matching

H0 = datetime(2025, 6, 1, 10, tzinfo=UTC)
HOUR = timedelta(hours=1)
VINTAGE = (datetime(2025, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC))
RESIDUAL = ResidualMix(zone="FR", year=2025, intensity_g_per_kwh=Decimal("60"), source="illustrative")
FAST = settings(max_examples=80, deadline=None)


def _use(
    start: datetime, energy_j: Decimal | int, *, zone: str = "FR", category: str = "scope2", pue: str = "1"
) -> Consumption:
    return Consumption(
        site_id=f"site-{zone}",
        zone=zone,
        start=start,
        end=start + HOUR,
        energy_j=Decimal(energy_j),
        pue=Decimal(pue),
        pue_relative_uncertainty=Decimal(0),
        meter_relative_uncertainty=Decimal(0),
        scope_category=category,  # type: ignore[arg-type]
    )


def _instrument(
    instrument_id: str,
    *,
    kind: str = "GO",
    hourly: dict[datetime, Decimal] | None = None,
    mwh: Decimal | None = None,
    intensity: str = "0",
    zone: str = "FR",
    **criteria: bool,
) -> Instrument:
    attested = dict.fromkeys(RELEVANT_CRITERIA[kind], True)  # type: ignore[index]
    attested.update(criteria)
    total = mwh if hourly is None else sum(hourly.values(), Decimal(0))
    return Instrument(
        instrument_id=instrument_id,
        kind=kind,  # type: ignore[arg-type]
        zone=zone,
        vintage_start=VINTAGE[0],
        vintage_end=VINTAGE[1],
        mwh=total,
        intensity_g_per_kwh=Decimal(intensity),
        quality_criteria=attested,
        hourly_mwh=hourly,
    )


KWH = J_PER_KWH  # joules


def test_hourly_volumes_cover_only_their_own_hour_and_what_an_hour_leaves_expires() -> None:
    uses = [_use(H0, KWH), _use(H0 + HOUR, KWH)]
    go = _instrument("GO-1", hourly={H0: Decimal("0.0005"), H0 + HOUR: Decimal("0.002")})

    matching = hourly_matching(uses, [go])

    assert [(h.hour, h.consumption_j, h.matched_j, h.unmatched_j) for h in matching.hours] == [
        (H0, KWH, KWH / 2, KWH / 2),
        (H0 + HOUR, KWH, KWH, Decimal(0)),
    ]
    assert matching.share == Decimal("0.75")
    assert matching.covered_j == {"GO-1": KWH * Decimal("1.5")}
    market = market_based(uses, [go], [RESIDUAL], [])
    assert market.covered_mwh == {"GO-1": Decimal("0.0015")}
    (use,) = market.instruments_used
    assert use.unused_mwh == Decimal("0.001")  # the second hour's surplus, not carried to the first
    # The first hour's uncovered half at the residual mix: 0.5 kWh x 60 g/kWh.
    assert market.total.co2e_g == Decimal("30")


def test_the_same_volume_as_an_annual_certificate_covers_both_hours() -> None:
    uses = [_use(H0, KWH), _use(H0 + HOUR, KWH)]
    rec = _instrument("REC-1", kind="REC", mwh=Decimal("0.0025"))

    assert market_based(uses, [rec], [RESIDUAL], []).total.co2e_g == 0
    assert hourly_matching(uses, [rec]).share == 0  # annual certificates are matched annually only


def test_annual_certificates_cover_what_the_hourly_volumes_leave_and_hourly_volumes_go_first() -> None:
    uses = [_use(H0, KWH), _use(H0 + HOUR, KWH)]
    # "A-REC" sorts before "GO-1": were the annual certificate applied first it would take both hours and
    # the hourly volume would expire unused.
    rec = _instrument("A-REC", kind="REC", mwh=Decimal("0.0005"))
    go = _instrument("GO-1", hourly={H0: Decimal("0.001")})

    market = market_based(uses, [rec, go], [RESIDUAL], [])

    assert market.covered_mwh == {"GO-1": Decimal("0.001"), "A-REC": Decimal("0.0005")}
    assert market.total.co2e_g == Decimal("30")  # 0.5 kWh of the second hour at 60 g/kWh
    assert hourly_matching(uses, [rec, go]).share == Decimal("0.5")


def test_only_qualifying_carbon_free_hourly_volumes_count_in_the_hourly_share() -> None:
    uses = [_use(H0, KWH)]
    volumes = {H0: Decimal("0.001")}
    supplier = _instrument("SUP-1", kind="supplier_rate", hourly=volumes, intensity="250")
    unretired = _instrument("GO-2", hourly=volumes, retired_for_reporter=False)
    elsewhere = _instrument("GO-3", hourly=volumes, zone="DE")

    matching = hourly_matching(uses, [supplier, unretired, elsewhere])

    assert matching.matched_j == 0 and matching.share == 0
    assert matching.instruments == ("GO-3",)  # qualifies, but for another market than the consumption's
    assert hourly_matching(uses, [_instrument("GO-4", hourly=volumes)]).share == 1


def test_cloud_consumption_is_not_matched_and_the_share_is_none_without_own_consumption() -> None:
    go = _instrument("GO-1", hourly={H0: Decimal("0.001")})

    matching = hourly_matching([_use(H0, KWH, category="scope3_cat1")], [go])

    assert matching.consumption_j == 0 and matching.share is None


def test_facility_energy_is_matched_pue_included() -> None:
    go = _instrument("GO-1", hourly={H0: Decimal("0.001")})

    matching = hourly_matching([_use(H0, KWH, pue="1.25")], [go])

    assert matching.consumption_j == KWH * Decimal("1.25")
    assert matching.share == Decimal("0.8")


@pytest.mark.parametrize(
    ("hourly", "mwh", "why"),
    [
        ({H0 + timedelta(minutes=30): Decimal("0.001")}, None, "whole UTC hour"),
        ({datetime(2027, 1, 1, tzinfo=UTC): Decimal("0.001")}, None, "vintage"),
        ({H0: Decimal("-0.001"), H0 + HOUR: Decimal("0.002")}, None, ">= 0"),
        ({H0: Decimal("0.001")}, Decimal("0.002"), "sum of its hourly volumes"),
        ({H0: Decimal(0)}, None, "> 0"),
        ({datetime(2025, 6, 1, 10): Decimal("0.001")}, None, "timezone-aware"),
    ],
)
def test_an_instrument_refuses_hourly_volumes_it_cannot_hold(
    hourly: dict[datetime, Decimal], mwh: Decimal | None, why: str
) -> None:
    with pytest.raises((ValueError, TypeError), match=why):
        Instrument(
            instrument_id="GO-x",
            kind="GO",
            zone="FR",
            vintage_start=VINTAGE[0],
            vintage_end=VINTAGE[1],
            mwh=sum(hourly.values(), Decimal(0)) if mwh is None else mwh,
            intensity_g_per_kwh=Decimal(0),
            hourly_mwh=hourly,
        )


def test_hourly_volumes_given_at_another_offset_are_the_same_utc_hour() -> None:
    go = _instrument("GO-1", hourly={H0.astimezone(ZoneInfo("Europe/Paris")): Decimal("0.001")})

    assert go.hourly_mwh == {H0: Decimal("0.001")}


# ------------------------------------------------------------------------------------------------------------
# Properties
# ------------------------------------------------------------------------------------------------------------

HOURS = 6
energies = st.integers(0, 5 * 10**7)  # joules per slice (up to ~14 kWh)
volumes = st.decimals(min_value=0, max_value=Decimal("0.02"), places=6, allow_nan=False, allow_infinity=False)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[Consumption], list[Instrument]]:
    uses: list[Consumption] = []
    for _ in range(draw(st.integers(0, 8))):
        hour = H0 + HOUR * draw(st.integers(0, HOURS - 1))
        offset = timedelta(minutes=draw(st.integers(0, 59)))
        length = timedelta(minutes=draw(st.integers(1, 150)))
        uses.append(
            Consumption(
                site_id=draw(st.sampled_from(("a", "b"))),
                zone=draw(st.sampled_from(("FR", "DE"))),
                start=hour + offset,
                end=hour + offset + length,
                energy_j=Decimal(draw(energies)),
                pue=draw(st.sampled_from((Decimal(1), Decimal("1.35")))),
                pue_relative_uncertainty=Decimal(0),
                meter_relative_uncertainty=Decimal(0),
                scope_category=draw(st.sampled_from(("scope2", "scope2", "scope3_cat1"))),
            )
        )
    instruments: list[Instrument] = []
    for n in range(draw(st.integers(0, 3))):
        hourly = {
            H0 + HOUR * h: draw(volumes)
            for h in draw(st.sets(st.integers(0, HOURS + 1), min_size=1, max_size=8))
        }
        if sum(hourly.values(), Decimal(0)) == 0:
            continue
        instruments.append(_instrument(f"GO-{n}", hourly=hourly, zone=draw(st.sampled_from(("FR", "DE")))))
    if draw(st.booleans()):
        instruments.append(_instrument("REC-annual", kind="REC", mwh=draw(volumes) + Decimal("0.000001")))
    return uses, instruments


@FAST
@given(scenarios())
def test_matched_plus_unmatched_is_the_consumption_of_every_hour_and_the_share_lies_in_0_1(
    scenario: tuple[list[Consumption], list[Instrument]],
) -> None:
    uses, instruments = scenario

    matching = hourly_matching(uses, instruments)

    own = [u for u in uses if u.scope_category == "scope2"]
    expected: dict[tuple[str, datetime], Decimal] = defaultdict(Decimal)
    for use in own:
        for piece in split_by_hour(use):
            expected[(piece.zone, piece.start.replace(minute=0))] += piece.facility_energy_j
    assert {(h.zone, h.hour): h.consumption_j for h in matching.hours} == dict(expected)
    for hour in matching.hours:
        assert hour.matched_j + hour.unmatched_j == hour.consumption_j
        assert 0 <= hour.matched_j <= hour.consumption_j
        assert sum((take for _, take in hour.takes), Decimal(0)) == hour.matched_j
    assert matching.matched_j + matching.unmatched_j == matching.consumption_j
    if matching.consumption_j == 0:
        assert matching.share is None
    else:
        assert matching.share is not None and 0 <= matching.share <= 1


@FAST
@given(scenarios())
def test_an_instrument_never_covers_more_than_its_volume_of_the_hour_and_matching_is_greedy(
    scenario: tuple[list[Consumption], list[Instrument]],
) -> None:
    uses, instruments = scenario

    matching = hourly_matching(uses, instruments)

    by_id = {i.instrument_id: i for i in instruments}
    for hour in matching.hours:
        available = Decimal(0)
        for instrument in instruments:
            if instrument.hourly_mwh is not None and instrument.zone == hour.zone:
                available += instrument.hourly_mwh.get(hour.hour, Decimal(0)) * J_PER_MWH
        for instrument_id, take in hour.takes:
            volumes_of = by_id[instrument_id].hourly_mwh
            assert volumes_of is not None and by_id[instrument_id].zone == hour.zone
            assert 0 < take <= volumes_of.get(hour.hour, Decimal(0)) * J_PER_MWH
        # Nothing left unmatched while a volume of the hour is unused.
        assert hour.matched_j == min(hour.consumption_j, available)
    for instrument_id, covered in matching.covered_j.items():
        mwh = by_id[instrument_id].mwh
        assert mwh is not None and covered <= mwh * J_PER_MWH


@FAST
@given(scenarios())
def test_the_market_based_method_uses_the_hourly_volumes_exactly_as_the_hourly_matching_does(
    scenario: tuple[list[Consumption], list[Instrument]],
) -> None:
    uses, instruments = scenario

    matching = hourly_matching(uses, instruments)
    market = market_based(uses, instruments, [RESIDUAL, ResidualMix("DE", 2025, Decimal("500"), "x")], [])

    hourly_ids = {i.instrument_id for i in instruments if i.hourly_mwh is not None}
    assert {k: v for k, v in market.covered_mwh.items() if k in hourly_ids} == matching.covered_mwh
