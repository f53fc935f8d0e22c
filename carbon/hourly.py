"""Hourly matching: the share of consumption that contracted carbon-free energy covers within the same hour.

The GHG Protocol's Scope 2 revision proposes (public consultation, 2025; not yet a standard) that market-based
claims match instruments to consumption hour by hour rather than over a year. This module computes that
share beside the annual method the inventory reports: for every zone and UTC hour, the facility energy of the
reporter's own operations (Scope 2) and the hourly volumes of its qualifying carbon-free instruments (granular
certificates, or hourly supplier figures at 0 g/kWh) of that zone and hour; the matched energy is the smaller of
the two, taken from the instruments in the order the market-based method applies them
(:func:`carbon.co2e.market_based` puts hourly volumes first), so both agree to the joule.

What is not counted, by design: instruments matched annually (their volumes carry no hour), carbon-free energy
of the grid mix (not contracted), instruments failing a quality criterion, and cloud consumption (Scope 3).

A framework-free core like :mod:`carbon.co2e`: standard library only, exact decimals (additions,
subtractions and multiplications exact; the share is the one division, to ``DIVISION_PRECISION`` digits).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import (
    MAX_EMAX,
    MAX_PREC,
    MIN_EMIN,
    ROUND_HALF_EVEN,
    Context,
    Decimal,
    DivisionByZero,
    Inexact,
    InvalidOperation,
    Overflow,
    Rounded,
)
from typing import Final

from carbon.co2e import (
    DIVISION_PRECISION,
    J_PER_MWH,
    Consumption,
    Instrument,
    ScopeCategory,
    instrument_problems,
    split_by_hour,
)

__all__ = ["HourMatch", "HourlyMatching", "hourly_carbon_free", "hourly_matching"]

# As in carbon.co2e: additions and multiplications at unbounded precision, any rounding trapped.
_EXACT: Final = Context(
    prec=MAX_PREC,
    Emax=MAX_EMAX,
    Emin=MIN_EMIN,
    rounding=ROUND_HALF_EVEN,
    traps=[Inexact, Rounded, InvalidOperation, DivisionByZero, Overflow],
)
_DIV: Final = Context(
    prec=DIVISION_PRECISION, rounding=ROUND_HALF_EVEN, traps=[InvalidOperation, DivisionByZero, Overflow]
)
_ZERO: Final = Decimal(0)


@dataclass(frozen=True)
class HourMatch:
    """One zone and UTC hour: the facility energy consumed, the part matched, and each instrument's take (J)."""

    zone: str
    hour: datetime
    consumption_j: Decimal
    matched_j: Decimal
    takes: tuple[tuple[str, Decimal], ...]

    @property
    def unmatched_j(self) -> Decimal:
        return _EXACT.subtract(self.consumption_j, self.matched_j)


@dataclass(frozen=True)
class HourlyMatching:
    """The hours (by zone, then hour), their totals, and the joules each counted instrument covered."""

    hours: tuple[HourMatch, ...]
    consumption_j: Decimal
    matched_j: Decimal
    covered_j: dict[str, Decimal]
    instruments: tuple[str, ...]  # the hourly carbon-free instruments counted, in application order

    @property
    def unmatched_j(self) -> Decimal:
        return _EXACT.subtract(self.consumption_j, self.matched_j)

    @property
    def share(self) -> Decimal | None:
        """Matched / consumed facility energy, in [0, 1]; None when there is no own consumption."""
        if self.consumption_j == 0:
            return None
        return _DIV.divide(self.matched_j, self.consumption_j)

    @property
    def covered_mwh(self) -> dict[str, Decimal]:
        """MWh covered by each counted instrument, divided as :attr:`carbon.co2e.MarketResult.covered_mwh`."""
        return {key: _DIV.divide(joules, J_PER_MWH) for key, joules in self.covered_j.items()}


def hourly_carbon_free(instrument: Instrument) -> bool:
    """Contracted carbon-free energy with hourly volumes that meets every quality criterion."""
    return (
        instrument.hourly_mwh is not None
        and instrument.intensity_g_per_kwh == 0
        and not instrument_problems(instrument)
    )


def hourly_matching(
    consumptions: Iterable[Consumption],
    instruments: Iterable[Instrument],
    *,
    categories: Collection[ScopeCategory] = frozenset({"scope2"}),
) -> HourlyMatching:
    """Match the consumption of ``categories`` (default: own operations, Scope 2) hour by hour against the
    hourly volumes of the qualifying carbon-free instruments of the same zone.

    Consumptions are split on UTC hours (:func:`carbon.co2e.split_by_hour`) and summed per zone and hour in
    facility joules (energy x PUE). In each hour the instruments are taken in ``instrument_id`` order (the
    order :func:`carbon.co2e.market_based` applies them in), each at most its volume of that hour, until the
    hour's consumption is matched. So in every hour matched + unmatched = consumption, no instrument covers
    more than its volume, and matched = min(consumption, the hour's volumes).
    """
    wanted = frozenset(categories)
    consumed: dict[tuple[str, datetime], Decimal] = {}
    for consumption in consumptions:
        if consumption.scope_category not in wanted:
            continue
        for piece in split_by_hour(consumption):
            key = (piece.zone, piece.start.replace(minute=0, second=0, microsecond=0))
            consumed[key] = _EXACT.add(consumed.get(key, _ZERO), piece.facility_energy_j)
    counted = sorted((i for i in instruments if hourly_carbon_free(i)), key=lambda i: i.instrument_id)
    covered: dict[str, Decimal] = {i.instrument_id: _ZERO for i in counted}
    hours: list[HourMatch] = []
    for (zone, hour), consumption_j in sorted(consumed.items()):
        left = consumption_j
        takes: list[tuple[str, Decimal]] = []
        for instrument in counted:
            if left == 0:
                break
            if instrument.zone != zone or not instrument.vintage_start <= hour < instrument.vintage_end:
                continue
            volumes = instrument.hourly_mwh or {}
            take = min(left, _EXACT.multiply(volumes.get(hour, _ZERO), J_PER_MWH))
            if take == 0:
                continue
            left = _EXACT.subtract(left, take)
            covered[instrument.instrument_id] = _EXACT.add(covered[instrument.instrument_id], take)
            takes.append((instrument.instrument_id, take))
        matched = _EXACT.subtract(consumption_j, left)
        hours.append(HourMatch(zone, hour, consumption_j, matched, tuple(takes)))
    return HourlyMatching(
        hours=tuple(hours),
        consumption_j=_total(h.consumption_j for h in hours),
        matched_j=_total(h.matched_j for h in hours),
        covered_j=covered,
        instruments=tuple(i.instrument_id for i in counted),
    )


def _total(values: Iterable[Decimal]) -> Decimal:
    result = _ZERO
    for value in values:
        result = _EXACT.add(result, value)
    return result
