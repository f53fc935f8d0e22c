"""CO2e arithmetic: metered energy -> grams of CO2e, location- and market-based, SCI, uncertainty.

A framework-free core: standard library only, no Django, no settings. Everything the calculation needs is an
argument, so the same code serves the API, the report builder and the tests.

Units are in the names: ``energy_j`` (joules of IT energy, as metered), ``energy_kwh`` (kWh of *facility*
energy, i.e. IT energy x PUE), ``co2e_g`` (grams CO2e), ``intensity_g_per_kwh``, ``pue`` (dimensionless,
>= 1), ``*_relative_uncertainty`` (half-width of the 95 % confidence interval as a fraction of the value,
e.g. ``Decimal("0.05")`` for +/-5 %). 1 kWh = 3.6e6 J exactly.

Arithmetic and rounding rules
-----------------------------
* Every quantity is a :class:`decimal.Decimal`; binary floats are refused (``TypeError``) because they cannot
  represent figures such as 41.44 exactly. ``int`` is accepted and converted exactly.
* Additions, subtractions and multiplications are done in an *exact* context (unbounded precision, and the
  ``Inexact`` signal is trapped, so a silent rounding would raise instead).
* Division by 3.6e6 J/kWh (and any other division, square root) cannot in general be exact (3.6e6 has the
  factor 3^2). Divisions are therefore postponed: the calculation accumulates exact numerators
  (facility joules x g/kWh) and divides once per reported figure, to :data:`DIVISION_PRECISION` (50)
  significant digits with ``ROUND_HALF_EVEN``. A total is the division of the exact sum of numerators, never
  the sum of divided lines, so regrouping or splitting consumption cannot change a total by even one digit.
* Nothing is quantized inside the calculation. Quantization happens only at the reporting edge:
  :func:`report_g` (0.001 g, ``ROUND_HALF_EVEN``), :func:`report_kwh` (0.000001 kWh, ``ROUND_HALF_EVEN``),
  :func:`report_uncertainty_g` (0.001 g, ``ROUND_CEILING``) and :func:`report_relative` (0.0001,
  ``ROUND_CEILING``). Uncertainties round *up* so a printed interval is never narrower than the computed one.
  A rounded total is the rounding of the full-precision total, so it may differ from the sum of the rounded
  lines by up to 0.0005 g per line.
* :func:`split_by_hour` is the only place energy itself is divided; see its docstring for the remainder rule.

Times are timezone-aware datetimes; they are converted to UTC on construction and naive datetimes are refused.
"Year" always means the UTC calendar year of a slice's start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from decimal import (
    MAX_EMAX,
    MAX_PREC,
    MIN_EMIN,
    ROUND_CEILING,
    ROUND_HALF_EVEN,
    Context,
    Decimal,
    DivisionByZero,
    Inexact,
    InvalidOperation,
    Overflow,
    Rounded,
)
from typing import Final, Literal, TypeVar

__all__ = [
    "DIVISION_PRECISION",
    "ENERGY_SPLIT_QUANTUM_J",
    "FIRST_YEAR",
    "ISO_14064_CATEGORY",
    "J_PER_KWH",
    "J_PER_MWH",
    "LAST_YEAR",
    "MAX_VINTAGE",
    "RELEVANT_CRITERIA",
    "AmbiguousFactor",
    "Consumption",
    "Disclosure",
    "ExcludedInstrument",
    "Factor",
    "FactorChoice",
    "FactorUse",
    "Instrument",
    "InstrumentUse",
    "LocationLine",
    "LocationResult",
    "MarketLine",
    "MarketResult",
    "NoFactor",
    "ResidualMix",
    "Total",
    "embodied_share_g",
    "instrument_problems",
    "location_based",
    "market_based",
    "relative_uncertainty_of_product",
    "report_g",
    "report_kwh",
    "report_relative",
    "report_uncertainty_g",
    "sci_per_request",
    "select_factor",
    "split_by_hour",
    "uncertainty_of_sum",
    "vintage_problems",
    "year_problem",
]

Granularity = Literal["hour", "year"]
Basis = Literal["direct", "lifecycle"]
ScopeCategory = Literal["scope2", "scope3_cat1"]
InstrumentKind = Literal["REC", "GO", "I-REC", "PPA", "supplier_rate"]
FactorMatch = Literal["hour", "year", "nearest_year"]
MarketSource = Literal["instrument", "residual_mix", "grid_average"]

J_PER_KWH: Final = Decimal(3_600_000)
J_PER_MWH: Final = Decimal(3_600_000_000)

#: Significant digits kept by every division and square root (ROUND_HALF_EVEN).
DIVISION_PRECISION: Final = 50

#: Resolution of the energy shares produced by :func:`split_by_hour` (1 nJ; meters report mJ at best).
ENERGY_SPLIT_QUANTUM_J: Final = Decimal("1E-9")

REPORT_G_QUANTUM: Final = Decimal("0.001")
REPORT_KWH_QUANTUM: Final = Decimal("0.000001")
REPORT_RELATIVE_QUANTUM: Final = Decimal("0.0001")

#: The years every stored date and every queried instant must fall in: one range for the services, forms,
#: serializers and query parsing alike. The ledger counts nanoseconds since 1970 in signed 64-bit columns
#: (good to 2262); a factor, PUE record, instrument or report outside it would value periods no ledger holds.
FIRST_YEAR: Final = 1970
LAST_YEAR: Final = 2100

#: The longest vintage of one instrument: a calendar year, leap years included. Certificates are issued for a
#: production period, supplier rates are disclosed per year, and Quality Criterion 4 wants the vintage close
#: to the period of use; a longer contract is recorded as one instrument per year, each with its own MWh.
MAX_VINTAGE: Final = timedelta(days=366)

SCOPE_CATEGORIES: Final[tuple[ScopeCategory, ...]] = ("scope2", "scope3_cat1")

#: How each scope category maps onto ISO 14064-1:2018 reporting categories.
ISO_14064_CATEGORY: Final[Mapping[ScopeCategory, str]] = {
    # Owned or colocated hardware: GHG Protocol Scope 2, purchased electricity.
    "scope2": "ISO 14064-1 Category 2: indirect GHG emissions from imported energy",
    # Cloud inference: GHG Protocol Scope 3 Category 1, purchased goods and services.
    "scope3_cat1": "ISO 14064-1 Category 4: indirect GHG emissions from products used by the organization",
}

_GRANULARITIES: Final = ("hour", "year")
_BASES: Final = ("direct", "lifecycle")
_KINDS: Final = ("REC", "GO", "I-REC", "PPA", "supplier_rate")

# Quality criteria of the GHG Protocol Scope 2 Guidance (2015), chapter 7 (Table 7.1), by the keys callers use.
_CRITERION_TEXT: Final[Mapping[str, str]] = {
    "conveys_attributes": "criterion 1: conveys the GHG emission rate attribute of the electricity",
    "unique_claim": "criterion 2: the only instrument carrying that claim",
    "retired_for_reporter": "criterion 3: tracked and retired/cancelled by or for the reporting entity",
    "vintage_matches_period": "criterion 4: issued and redeemed close to the period of consumption",
    "same_market": "criterion 5: sourced from the market where the electricity is consumed",
    "supplier_rate_disclosed": "criterion 6: supplier rate calculated on delivered electricity and disclosed",
    "residual_mix_adjusted": "criterion 8: claimed attributes removed from the residual mix",
}

#: The criteria each kind of instrument must attest (present and ``True``) to be used.
_ATTRIBUTE_CRITERIA: Final = (
    "conveys_attributes",
    "unique_claim",
    "retired_for_reporter",
    "vintage_matches_period",
    "same_market",
    "residual_mix_adjusted",
)

#: The criteria each kind of instrument must attest (present and ``True``) to be used.
RELEVANT_CRITERIA: Final[Mapping[InstrumentKind, tuple[str, ...]]] = {
    "REC": _ATTRIBUTE_CRITERIA,
    "GO": _ATTRIBUTE_CRITERIA,
    "I-REC": _ATTRIBUTE_CRITERIA,
    "PPA": _ATTRIBUTE_CRITERIA,
    # A supplier retires certificates on behalf of all its customers, so "retired_for_reporter" does not apply;
    # criterion 6 (a rate calculated on delivered electricity, disclosed) takes its place.
    "supplier_rate": (
        "conveys_attributes",
        "unique_claim",
        "vintage_matches_period",
        "same_market",
        "supplier_rate_disclosed",
        "residual_mix_adjusted",
    ),
}

# Exact arithmetic: additions and multiplications of finite decimals are exact at unbounded precision; the
# traps turn any rounding into an exception. Never divide or take a square root in this context.
_EXACT: Final = Context(
    prec=MAX_PREC,
    Emax=MAX_EMAX,
    Emin=MIN_EMIN,
    rounding=ROUND_HALF_EVEN,
    traps=[Inexact, Rounded, InvalidOperation, DivisionByZero, Overflow],
)
# Divisions and square roots.
_DIV: Final = Context(
    prec=DIVISION_PRECISION, rounding=ROUND_HALF_EVEN, traps=[InvalidOperation, DivisionByZero, Overflow]
)
# Quantization at the reporting edge (the rounding mode is given per call).
_EDGE: Final = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[InvalidOperation, Overflow])

_ZERO: Final = Decimal(0)
_ONE: Final = Decimal(1)
_HOUR: Final = timedelta(hours=1)
_MICROSECOND: Final = timedelta(microseconds=1)

_T = TypeVar("_T")


# --------------------------------------------------------------------------------------------------------------
# Exceptions
# --------------------------------------------------------------------------------------------------------------


class NoFactor(LookupError):
    """No location-based factor can be chosen for a zone (the zone has no factor at all, or only hourly
    factors, none of which covers the instant asked for)."""

    def __init__(self, zone: str, detail: str = "") -> None:
        self.zone = zone
        message = f"no carbon-intensity factor for zone {zone!r}"
        super().__init__(f"{message}: {detail}" if detail else message)


class AmbiguousFactor(ValueError):
    """Several factors of the same zone and granularity cover the same hour or year; the caller must pick the
    version and basis it wants before calling (this module never guesses between them)."""

    def __init__(self, zone: str, factor_ids: Sequence[str]) -> None:
        self.zone = zone
        self.factor_ids = tuple(factor_ids)
        super().__init__(f"ambiguous factors for zone {zone!r}: {', '.join(self.factor_ids)}")


# --------------------------------------------------------------------------------------------------------------
# Exact helpers and validation
# --------------------------------------------------------------------------------------------------------------


def _mul(*values: Decimal) -> Decimal:
    result = _ONE
    for value in values:
        result = _EXACT.multiply(result, value)
    return result


def _sum(values: Iterable[Decimal]) -> Decimal:
    result = _ZERO
    for value in values:
        result = _EXACT.add(result, value)
    return result


def _sub(a: Decimal, b: Decimal) -> Decimal:
    return _EXACT.subtract(a, b)


def _div(a: Decimal, b: Decimal) -> Decimal:
    return _DIV.divide(a, b)


def _quadrature(absolutes: Iterable[Decimal]) -> Decimal:
    """sqrt(sum of squares): squares and sum exact, one square root at DIVISION_PRECISION."""
    return _DIV.sqrt(_sum(_EXACT.multiply(a, a) for a in absolutes))


def _decimal(value: object, name: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, Decimal | int):
        raise TypeError(f"{name} must be a Decimal (or an int), not {type(value).__name__}")
    result = Decimal(value)
    if not result.is_finite():
        raise ValueError(f"{name} must be finite, got {result}")
    return result


def _non_negative(value: object, name: str) -> Decimal:
    result = _decimal(value, name)
    if result < 0:
        raise ValueError(f"{name} must be >= 0, got {result}")
    return result


def _positive(value: object, name: str) -> Decimal:
    result = _decimal(value, name)
    if result <= 0:
        raise ValueError(f"{name} must be > 0, got {result}")
    return result


def _utc(value: object, name: str) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (UTC), got naive {value.isoformat()}")
    return value.astimezone(UTC)


def _on_the_hour(value: datetime) -> bool:
    return value.minute == 0 and value.second == 0 and value.microsecond == 0


def _floor_hour(value: datetime) -> datetime:
    return value.replace(minute=0, second=0, microsecond=0)


def _year_start(year: int) -> datetime:
    return datetime(year, 1, 1, tzinfo=UTC)


def year_problem(value: date, name: str) -> str:
    """Why ``value`` (a date, or a datetime in UTC) lies outside the years FIRST_YEAR-LAST_YEAR; "" if not."""
    if FIRST_YEAR <= value.year <= LAST_YEAR:
        return ""
    return f"{name} {value.isoformat()} is outside the years {FIRST_YEAR}-{LAST_YEAR}"


def vintage_problems(vintage_start: datetime, vintage_end: datetime) -> tuple[str, ...]:
    """Why a vintage cannot be covered by one instrument: a bound outside the years, or longer than
    MAX_VINTAGE. An instrument covers what starts inside its vintage, so an unbounded vintage would cover
    every period (and an unlimited supplier rate every joule of them)."""
    start, end = _utc(vintage_start, "vintage_start"), _utc(vintage_end, "vintage_end")
    problems = [p for p in (year_problem(start, "vintage_start"), year_problem(end, "vintage_end")) if p]
    if end - start > MAX_VINTAGE:
        problems.append(
            f"the vintage {start.isoformat()} to {end.isoformat()} is longer than a year"
            f" ({MAX_VINTAGE.days} days at most): record one instrument per year"
        )
    return tuple(problems)


def _one_of(value: _T, allowed: Sequence[_T], name: str) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")


def _set(instance: object, name: str, value: object) -> None:
    object.__setattr__(instance, name, value)


# --------------------------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Factor:
    """A location-based (grid-average) carbon-intensity factor.

    ``period_end`` is exclusive. An ``"hour"`` factor covers exactly one whole UTC hour; a ``"year"`` factor
    covers exactly one UTC calendar year (use :meth:`annual`). ``basis`` ``"direct"`` is combustion only (what
    GHG Protocol Scope 2 / ISO 14064-1 Category 2 ask for); ``"lifecycle"`` includes upstream emissions and is
    labelled as such in the notes of every choice. ``relative_uncertainty`` is the 95 % half-width as a fraction.
    ``source`` and ``licence`` are the attribution a report must print (e.g. CC BY 4.0 for Ember/OWID data).
    """

    factor_id: str
    zone: str
    period_start: datetime
    period_end: datetime
    granularity: Granularity
    intensity_g_per_kwh: Decimal
    basis: Basis
    source: str
    licence: str
    relative_uncertainty: Decimal

    def __post_init__(self) -> None:
        start = _utc(self.period_start, "period_start")
        end = _utc(self.period_end, "period_end")
        _set(self, "period_start", start)
        _set(self, "period_end", end)
        _one_of(self.granularity, _GRANULARITIES, "granularity")
        _one_of(self.basis, _BASES, "basis")
        _set(self, "intensity_g_per_kwh", _non_negative(self.intensity_g_per_kwh, "intensity_g_per_kwh"))
        _set(self, "relative_uncertainty", _non_negative(self.relative_uncertainty, "relative_uncertainty"))
        if self.granularity == "hour" and not (_on_the_hour(start) and end - start == _HOUR):
            raise ValueError(f"hourly factor {self.factor_id} must cover one whole UTC hour")
        if self.granularity == "year" and not (
            start == _year_start(start.year) and end == _year_start(start.year + 1)
        ):
            raise ValueError(f"annual factor {self.factor_id} must cover one UTC calendar year")

    @classmethod
    def annual(
        cls,
        *,
        factor_id: str,
        zone: str,
        year: int,
        intensity_g_per_kwh: Decimal,
        basis: Basis,
        source: str,
        licence: str,
        relative_uncertainty: Decimal,
    ) -> Factor:
        """An annual-average factor covering the UTC calendar year ``year``."""
        return cls(
            factor_id=factor_id,
            zone=zone,
            period_start=_year_start(year),
            period_end=_year_start(year + 1),
            granularity="year",
            intensity_g_per_kwh=intensity_g_per_kwh,
            basis=basis,
            source=source,
            licence=licence,
            relative_uncertainty=relative_uncertainty,
        )


@dataclass(frozen=True)
class Consumption:
    """A slice of metered IT energy at one site.

    ``energy_j`` is the metered IT energy; the facility energy is ``energy_j x pue``. The two relative
    uncertainties (95 % half-widths, fractions) are those of the meter reading and of the PUE figure.
    ``scope_category``: ``"scope2"`` for owned/colocated hardware (ISO 14064-1 Category 2), ``"scope3_cat1"``
    for cloud (ISO 14064-1 Category 4). Slices may be of any length; the calculations split them on UTC hour
    boundaries with :func:`split_by_hour`.
    """

    site_id: str
    zone: str
    start: datetime
    end: datetime
    energy_j: Decimal
    pue: Decimal
    pue_relative_uncertainty: Decimal
    meter_relative_uncertainty: Decimal
    scope_category: ScopeCategory
    #: The caller's label for the slice (e.g. a rollup row), kept by :func:`split_by_hour` and on every
    #: result line so results can be broken down by what the caller knows; no role in the arithmetic.
    tag: str = ""

    def __post_init__(self) -> None:
        start = _utc(self.start, "start")
        end = _utc(self.end, "end")
        if not start < end:
            raise ValueError(
                f"consumption must have start < end, got {start.isoformat()} .. {end.isoformat()}"
            )
        _set(self, "start", start)
        _set(self, "end", end)
        _set(self, "energy_j", _non_negative(self.energy_j, "energy_j"))
        pue = _decimal(self.pue, "pue")
        if pue < 1:
            raise ValueError(f"pue must be >= 1, got {pue}")
        _set(self, "pue", pue)
        _set(
            self,
            "pue_relative_uncertainty",
            _non_negative(self.pue_relative_uncertainty, "pue_relative_uncertainty"),
        )
        _set(
            self,
            "meter_relative_uncertainty",
            _non_negative(self.meter_relative_uncertainty, "meter_relative_uncertainty"),
        )
        _one_of(self.scope_category, SCOPE_CATEGORIES, "scope_category")

    @property
    def facility_energy_j(self) -> Decimal:
        """IT energy x PUE, exact."""
        return _mul(self.energy_j, self.pue)

    @property
    def energy_kwh(self) -> Decimal:
        """Facility energy in kWh (energy_j / 3.6e6 x pue), to DIVISION_PRECISION digits."""
        return _div(self.facility_energy_j, J_PER_KWH)


@dataclass(frozen=True)
class Instrument:
    """A contractual instrument for the GHG Protocol Scope 2 market-based method.

    ``zone`` is the market the instrument belongs to. ``vintage_start``/``vintage_end`` (exclusive) must fall
    on whole UTC hours; a consumption hour is covered when it starts inside the vintage. ``mwh`` is the
    facility electricity the instrument covers; only a ``supplier_rate`` may leave it ``None``, meaning "all
    of the reporter's consumption in the zone during the vintage that no other instrument covers".
    ``intensity_g_per_kwh`` is 0 for certificates and renewable PPAs, the supplier's disclosed rate for a
    supplier rate. ``quality_criteria`` maps the keys of :data:`RELEVANT_CRITERIA` (plus any extra, stricter
    criteria of the caller's) to whether the instrument meets them; see :func:`instrument_problems`.
    """

    instrument_id: str
    kind: InstrumentKind
    zone: str
    vintage_start: datetime
    vintage_end: datetime
    mwh: Decimal | None
    intensity_g_per_kwh: Decimal
    quality_criteria: dict[str, bool] = field(default_factory=dict)
    #: Facility MWh per whole UTC hour, as granular (time-stamped) certificates or a supplier's hourly
    #: figures give them; ``None`` for an instrument matched over its whole vintage. Where given, the
    #: instrument covers at most an hour's volume in that hour (what the hour does not use expires, it is
    #: not moved to another hour) and ``mwh`` must be the sum of the volumes.
    hourly_mwh: Mapping[datetime, Decimal] | None = None

    def __post_init__(self) -> None:
        _one_of(self.kind, _KINDS, "kind")
        start = _utc(self.vintage_start, "vintage_start")
        end = _utc(self.vintage_end, "vintage_end")
        if not start < end:
            raise ValueError(f"instrument {self.instrument_id}: vintage_start must be before vintage_end")
        if not (_on_the_hour(start) and _on_the_hour(end)):
            raise ValueError(
                f"instrument {self.instrument_id}: vintage must start and end on whole UTC hours"
            )
        _set(self, "vintage_start", start)
        _set(self, "vintage_end", end)
        if self.mwh is None:
            if self.kind != "supplier_rate":
                raise ValueError(f"instrument {self.instrument_id}: only a supplier_rate may have mwh=None")
        else:
            _set(self, "mwh", _positive(self.mwh, "mwh"))
        _set(self, "intensity_g_per_kwh", _non_negative(self.intensity_g_per_kwh, "intensity_g_per_kwh"))
        criteria = dict(self.quality_criteria)
        for key, value in criteria.items():
            if not isinstance(value, bool):
                raise TypeError(f"instrument {self.instrument_id}: criterion {key!r} must be a bool")
        _set(self, "quality_criteria", criteria)
        if self.hourly_mwh is not None:
            _set(self, "hourly_mwh", self._checked_hours(self.hourly_mwh, start, end))

    def _checked_hours(
        self, hourly: Mapping[datetime, Decimal], start: datetime, end: datetime
    ) -> dict[datetime, Decimal]:
        hours: dict[datetime, Decimal] = {}
        for key, volume in hourly.items():
            hour = _utc(key, f"instrument {self.instrument_id}: hour")
            if not _on_the_hour(hour):
                raise ValueError(
                    f"instrument {self.instrument_id}: hourly volume at {hour.isoformat()} is not on a whole UTC hour"
                )
            if not start <= hour < end:
                raise ValueError(
                    f"instrument {self.instrument_id}: hourly volume at {hour.isoformat()} is outside its vintage"
                )
            if hour in hours:
                raise ValueError(f"instrument {self.instrument_id}: two volumes for {hour.isoformat()}")
            hours[hour] = _non_negative(
                volume, f"instrument {self.instrument_id}: volume at {hour.isoformat()}"
            )
        total = _sum(hours.values())
        if self.mwh != total:
            raise ValueError(
                f"instrument {self.instrument_id}: mwh ({self.mwh}) must be the sum of its hourly volumes ({total})"
            )
        return dict(sorted(hours.items()))


@dataclass(frozen=True)
class ResidualMix:
    """The residual-mix intensity of a market for a calendar year (e.g. AIB European Residual Mixes).

    ``relative_uncertainty`` (95 % half-width) is an extension: publishers rarely state one, so it defaults to
    0, and the market-based result then discloses that the residual share carries metering and PUE
    uncertainty only.
    """

    zone: str
    year: int
    intensity_g_per_kwh: Decimal
    source: str
    relative_uncertainty: Decimal = _ZERO

    def __post_init__(self) -> None:
        _set(self, "intensity_g_per_kwh", _non_negative(self.intensity_g_per_kwh, "intensity_g_per_kwh"))
        _set(self, "relative_uncertainty", _non_negative(self.relative_uncertainty, "relative_uncertainty"))


# --------------------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Total:
    """A total at full precision: facility energy, CO2e and its 95 % uncertainty (absolute and relative)."""

    energy_kwh: Decimal
    co2e_g: Decimal
    uncertainty_g: Decimal
    relative_uncertainty: Decimal

    def rounded(self) -> Total:
        """The same total quantized for a report (see the module docstring for the rules)."""
        return Total(
            energy_kwh=report_kwh(self.energy_kwh),
            co2e_g=report_g(self.co2e_g),
            uncertainty_g=report_uncertainty_g(self.uncertainty_g),
            relative_uncertainty=report_relative(self.relative_uncertainty),
        )


@dataclass(frozen=True)
class FactorChoice:
    """The factor chosen for a zone and instant, how it matched, and notes a report must carry.

    ``match``: ``"hour"`` (an hourly factor covers the instant), ``"year"`` (the annual factor of that year),
    ``"nearest_year"`` (the annual factor of another year; ``mismatch`` is then ``True`` and a note says which
    year was used instead of which).
    """

    factor: Factor
    match: FactorMatch
    mismatch: bool
    notes: tuple[str, ...]


@dataclass(frozen=True)
class FactorUse:
    """A factor used by a location-based calculation, with every distinct note and what it was applied to."""

    factor: Factor
    notes: tuple[str, ...]
    energy_kwh: Decimal
    co2e_g: Decimal


@dataclass(frozen=True)
class LocationLine:
    """One hour slice valued at the grid average. ``energy_kwh`` is facility energy; ``relative_uncertainty``
    combines meter, PUE and factor uncertainties as a product."""

    consumption: Consumption
    choice: FactorChoice
    energy_kwh: Decimal
    co2e_g: Decimal
    relative_uncertainty: Decimal


@dataclass(frozen=True)
class LocationResult:
    """Location-based result: lines in chronological order, totals per scope category (both categories are
    always present) and overall, and the factors used in order of first use."""

    lines: tuple[LocationLine, ...]
    by_category: dict[ScopeCategory, Total]
    total: Total
    factors_used: tuple[FactorUse, ...]


@dataclass(frozen=True)
class MarketLine:
    """Part of one hour slice valued at one source: an instrument, the residual mix, or (when there is no
    residual mix) the grid average. ``source_id`` is the instrument id, the residual mix's source, or the
    factor id. ``energy_kwh`` is facility energy."""

    consumption: Consumption
    source: MarketSource
    source_id: str
    energy_kwh: Decimal
    intensity_g_per_kwh: Decimal
    co2e_g: Decimal
    relative_uncertainty: Decimal


@dataclass(frozen=True)
class InstrumentUse:
    """How much of a valid instrument was applied; ``unused_mwh`` is ``None`` for an unlimited supplier rate."""

    instrument: Instrument
    covered_mwh: Decimal
    unused_mwh: Decimal | None


@dataclass(frozen=True)
class ExcludedInstrument:
    """An instrument not used, with every reason."""

    instrument: Instrument
    reasons: tuple[str, ...]


QuantityKind = Literal["energy_kwh", "intensity_g_per_kwh"]
#: How a quantity of each kind is written into a disclosure's exact text (what JSON and CSV keep).
EXACT_QUANTITY: Final[Mapping[QuantityKind, Callable[[Decimal], str]]] = {
    "energy_kwh": lambda kwh: f"{report_kwh(kwh)} kWh",
    "intensity_g_per_kwh": lambda g: f"{g} g/kWh",
}


class Disclosure(str):
    """A sentence the market-based method asks a report to print. It is its exact text (numbers as the core
    holds them, what JSON and CSV keep), and it keeps the template and the quantities it was made from, so
    that the text shown to people is made where it is shown, with the one number formatter
    (:meth:`text`): this core does arithmetic and formats nothing for people."""

    template: str
    words: dict[str, str]
    quantities: dict[str, tuple[QuantityKind, Decimal]]

    def __new__(
        cls,
        template: str,
        words: Mapping[str, str] | None = None,
        quantities: Mapping[str, tuple[QuantityKind, Decimal]] | None = None,
    ) -> Disclosure:
        words, quantities = dict(words or {}), dict(quantities or {})
        made = super().__new__(cls, _fill(template, words, quantities, EXACT_QUANTITY))
        made.template, made.words, made.quantities = template, words, quantities
        return made

    def text(self, formats: Mapping[QuantityKind, Callable[[Decimal], str]]) -> str:
        """The sentence with each quantity written by ``formats`` (by kind of quantity)."""
        return _fill(self.template, self.words, self.quantities, formats)


def _fill(
    template: str,
    words: Mapping[str, str],
    quantities: Mapping[str, tuple[QuantityKind, Decimal]],
    formats: Mapping[QuantityKind, Callable[[Decimal], str]],
) -> str:
    shown = {name: formats[kind](value) for name, (kind, value) in quantities.items()}
    return template.format(**words, **shown)


@dataclass(frozen=True)
class MarketResult:
    """Market-based result: lines in chronological order, totals per scope category and overall, use of each
    valid instrument (in application order), excluded instruments with reasons, and disclosures a report must
    print."""

    lines: tuple[MarketLine, ...]
    by_category: dict[ScopeCategory, Total]
    total: Total
    instruments_used: tuple[InstrumentUse, ...]
    excluded: tuple[ExcludedInstrument, ...]
    disclosures: tuple[Disclosure, ...]

    @property
    def covered_mwh(self) -> dict[str, Decimal]:
        """MWh of facility electricity covered, by instrument id."""
        return {use.instrument.instrument_id: use.covered_mwh for use in self.instruments_used}


# --------------------------------------------------------------------------------------------------------------
# Reporting edge
# --------------------------------------------------------------------------------------------------------------


def report_g(co2e_g: Decimal, quantum: Decimal = REPORT_G_QUANTUM) -> Decimal:
    """Grams for a report: quantized to ``quantum`` (default 0.001 g), ROUND_HALF_EVEN. Pass a finer quantum
    for per-request figures such as SCI."""
    return _decimal(co2e_g, "co2e_g").quantize(quantum, rounding=ROUND_HALF_EVEN, context=_EDGE)


def report_kwh(energy_kwh: Decimal) -> Decimal:
    """kWh for a report: quantized to 0.000001 kWh (3.6 J), ROUND_HALF_EVEN."""
    return _decimal(energy_kwh, "energy_kwh").quantize(
        REPORT_KWH_QUANTUM, rounding=ROUND_HALF_EVEN, context=_EDGE
    )


def report_uncertainty_g(uncertainty_g: Decimal) -> Decimal:
    """An absolute uncertainty for a report: 0.001 g, rounded up (ROUND_CEILING), never narrower."""
    return _decimal(uncertainty_g, "uncertainty_g").quantize(
        REPORT_G_QUANTUM, rounding=ROUND_CEILING, context=_EDGE
    )


def report_relative(relative: Decimal) -> Decimal:
    """A relative uncertainty for a report: 0.0001 (0.01 percentage point), rounded up (ROUND_CEILING)."""
    return _decimal(relative, "relative").quantize(
        REPORT_RELATIVE_QUANTUM, rounding=ROUND_CEILING, context=_EDGE
    )


# --------------------------------------------------------------------------------------------------------------
# Uncertainty (IPCC 2006 Guidelines, Vol. 1, Ch. 3, Approach 1: error propagation)
# --------------------------------------------------------------------------------------------------------------


def relative_uncertainty_of_product(*relative: Decimal) -> Decimal:
    """Relative uncertainty of a product (e.g. energy x PUE x factor): sqrt(sum of squared relative
    uncertainties) (IPCC 2006 Vol. 1 Ch. 3, Equation 3.1).

    Assumes independent, roughly normal errors; Approach 1 degrades for large uncertainties, where IPCC
    recommends Approach 2 (Monte Carlo). Inputs and result are 95 % half-widths as fractions.
    """
    return _quadrature(_non_negative(r, "relative uncertainty") for r in relative)


def uncertainty_of_sum(terms: Iterable[tuple[Decimal, Decimal]]) -> tuple[Decimal, Decimal]:
    """Uncertainty of a sum of independent terms given as ``(value, relative_uncertainty)`` pairs
    (IPCC 2006 Vol. 1 Ch. 3, Equation 3.2): absolute = sqrt(sum((value x relative)^2)), relative =
    absolute / |sum of values|. Returns ``(absolute, relative)``.

    A zero sum with zero uncertainty has relative uncertainty 0; a zero sum with a non-zero uncertainty has
    none (``ValueError``).
    """
    values: list[Decimal] = []
    absolutes: list[Decimal] = []
    for value, relative in terms:
        v = _decimal(value, "value")
        values.append(v)
        absolutes.append(_mul(abs(v), _non_negative(relative, "relative uncertainty")))
    absolute = _quadrature(absolutes)
    total = abs(_sum(values))
    if total == 0:
        if absolute == 0:
            return absolute, _ZERO
        raise ValueError("relative uncertainty of a sum that is zero is undefined")
    return absolute, _div(absolute, total)


class _Accumulator:
    """Sums exact numerators (facility J x g/kWh) into per-category totals with uncertainty.

    Correlation model: lines of the same scope category, site and zone share a meter, a PUE figure and a
    factor source, so their errors are treated as fully correlated (absolute uncertainties add linearly);
    those groups are independent of each other and combine in quadrature within a category (Approach 1), and
    the category totals combine in quadrature into the overall total. Treating hour slices as independent
    instead would shrink the uncertainty by sqrt(number of slices) merely by metering more often.
    """

    def __init__(self) -> None:
        self._numerator: dict[tuple[ScopeCategory, str, str], Decimal] = {}
        self._abs_numerator: dict[tuple[ScopeCategory, str, str], Decimal] = {}
        self._energy_j: dict[ScopeCategory, Decimal] = {c: _ZERO for c in SCOPE_CATEGORIES}

    def add(
        self, consumption: Consumption, facility_j: Decimal, numerator: Decimal, relative: Decimal
    ) -> None:
        key = (consumption.scope_category, consumption.site_id, consumption.zone)
        self._numerator[key] = _EXACT.add(self._numerator.get(key, _ZERO), numerator)
        self._abs_numerator[key] = _EXACT.add(self._abs_numerator.get(key, _ZERO), _mul(numerator, relative))
        category = consumption.scope_category
        self._energy_j[category] = _EXACT.add(self._energy_j[category], facility_j)

    def totals(self) -> tuple[dict[ScopeCategory, Total], Total]:
        by_category: dict[ScopeCategory, Total] = {}
        category_absolutes: list[Decimal] = []
        for category in SCOPE_CATEGORIES:
            keys = [k for k in self._numerator if k[0] == category]
            co2e_g = _div(_sum(self._numerator[k] for k in keys), J_PER_KWH)
            absolute = _quadrature(_div(self._abs_numerator[k], J_PER_KWH) for k in keys)
            category_absolutes.append(absolute)
            by_category[category] = Total(
                energy_kwh=_div(self._energy_j[category], J_PER_KWH),
                co2e_g=co2e_g,
                uncertainty_g=absolute,
                relative_uncertainty=_ZERO if co2e_g == 0 else _div(absolute, co2e_g),
            )
        co2e_g = _div(_sum(self._numerator.values()), J_PER_KWH)
        absolute = _quadrature(category_absolutes)
        total = Total(
            energy_kwh=_div(_sum(self._energy_j.values()), J_PER_KWH),
            co2e_g=co2e_g,
            uncertainty_g=absolute,
            relative_uncertainty=_ZERO if co2e_g == 0 else _div(absolute, co2e_g),
        )
        return by_category, total


# --------------------------------------------------------------------------------------------------------------
# Splitting
# --------------------------------------------------------------------------------------------------------------


def _microseconds(delta: timedelta) -> int:
    return delta // _MICROSECOND


def split_by_hour(consumption: Consumption) -> tuple[Consumption, ...]:
    """Split a consumption on UTC hour boundaries, dividing its energy in proportion to time.

    Returns the consumption itself (a 1-tuple) when it does not cross an hour boundary. Otherwise every piece
    but the last gets ``floor(energy_j x piece_duration / total_duration)`` to the nearest
    :data:`ENERGY_SPLIT_QUANTUM_J` (1 nJ below; computed exactly in integer microseconds and nanojoules), and
    the last piece gets the exact remainder. So the pieces always add up to ``energy_j`` exactly, none is
    negative, and the last piece carries at most (pieces - 1) nJ more than its strict proportional share.
    Every other field is copied.
    """
    start, end = consumption.start, consumption.end
    bounds = [start]
    boundary = _floor_hour(start) + _HOUR
    while boundary < end:
        bounds.append(boundary)
        boundary += _HOUR
    bounds.append(end)
    if len(bounds) == 2:
        return (consumption,)
    total_us = Decimal(_microseconds(end - start))
    energy_exact = _EXACT.scaleb(consumption.energy_j, 9)  # in nJ, exact
    pieces: list[Consumption] = []
    allocated = _ZERO
    for position in range(len(bounds) - 2):
        piece_start, piece_end = bounds[position], bounds[position + 1]
        share_quanta = _EXACT.divide_int(
            _EXACT.multiply(energy_exact, Decimal(_microseconds(piece_end - piece_start))), total_us
        )
        share_j = _EXACT.scaleb(share_quanta, -9)
        allocated = _EXACT.add(allocated, share_j)
        pieces.append(replace(consumption, start=piece_start, end=piece_end, energy_j=share_j))
    pieces.append(
        replace(consumption, start=bounds[-2], end=end, energy_j=_sub(consumption.energy_j, allocated))
    )
    return tuple(pieces)


def _chronological_slices(consumptions: Iterable[Consumption]) -> list[Consumption]:
    """All hour slices, ordered by (start, end, input position, piece position): deterministic."""
    keyed: list[tuple[datetime, datetime, int, int, Consumption]] = []
    for position, consumption in enumerate(consumptions):
        if not isinstance(consumption, Consumption):
            raise TypeError(f"expected Consumption, got {type(consumption).__name__}")
        for piece_position, piece in enumerate(split_by_hour(consumption)):
            keyed.append((piece.start, piece.end, position, piece_position, piece))
    keyed.sort(key=lambda item: item[:4])
    return [item[4] for item in keyed]


# --------------------------------------------------------------------------------------------------------------
# Location-based factor selection
# --------------------------------------------------------------------------------------------------------------

_LIFECYCLE_NOTE: Final = (
    "lifecycle basis (includes upstream emissions), label it as such: GHG Protocol Scope 2 / "
    "ISO 14064-1 Category 2 call for direct (combustion) factors"
)


class _FactorIndex:
    """Factors indexed by zone and hour / year; choices cached per (zone, hour)."""

    def __init__(self, factors: Iterable[Factor]) -> None:
        self._hourly: dict[tuple[str, datetime], list[Factor]] = {}
        self._annual: dict[str, dict[int, list[Factor]]] = {}
        self._zones: set[str] = set()
        self._cache: dict[tuple[str, datetime], FactorChoice] = {}
        seen: set[str] = set()
        for factor in factors:
            if not isinstance(factor, Factor):
                raise TypeError(f"expected Factor, got {type(factor).__name__}")
            if factor.factor_id in seen:
                raise ValueError(f"duplicate factor_id {factor.factor_id!r}")
            seen.add(factor.factor_id)
            self._zones.add(factor.zone)
            if factor.granularity == "hour":
                self._hourly.setdefault((factor.zone, factor.period_start), []).append(factor)
            else:
                self._annual.setdefault(factor.zone, {}).setdefault(factor.period_start.year, []).append(
                    factor
                )

    def choose(self, zone: str, at: datetime) -> FactorChoice:
        key = (zone, _floor_hour(at))
        cached = self._cache.get(key)
        if cached is None:
            cached = self._choose(zone, at)
            self._cache[key] = cached
        return cached

    def _choose(self, zone: str, at: datetime) -> FactorChoice:
        if zone not in self._zones:
            raise NoFactor(zone)
        hourly = self._hourly.get((zone, _floor_hour(at)), [])
        if hourly:
            return _choice(zone, hourly, "hour", ())
        notes: tuple[str, ...] = ()
        if any(z == zone for z, _ in self._hourly):
            notes = (
                f"no hourly factor for {_floor_hour(at).isoformat()} in zone {zone}: annual average used",
            )
        by_year = self._annual.get(zone, {})
        if not by_year:
            raise NoFactor(
                zone, f"no hourly factor covers {at.isoformat()} and the zone has no annual factor"
            )
        year = at.year
        if year in by_year:
            return _choice(zone, by_year[year], "year", notes)
        # Nearest year; on a tie the earlier year, so publishing a newer figure never changes a past result
        # that already had an equally near one.
        used = min(by_year, key=lambda y: (abs(y - year), y))
        mismatch = (
            f"no factor for {year} in zone {zone}: the annual factor for {used} was used instead of {year} "
            "(nearest year)"
        )
        return _choice(zone, by_year[used], "nearest_year", (*notes, mismatch))


def _choice(zone: str, candidates: list[Factor], match: FactorMatch, notes: tuple[str, ...]) -> FactorChoice:
    if len(candidates) > 1:
        raise AmbiguousFactor(zone, sorted(f.factor_id for f in candidates))
    factor = candidates[0]
    if factor.basis == "lifecycle":
        notes = (*notes, _LIFECYCLE_NOTE)
    return FactorChoice(factor=factor, match=match, mismatch=match == "nearest_year", notes=notes)


def select_factor(zone: str, at: datetime, factors: Iterable[Factor]) -> FactorChoice:
    """Choose the location-based factor for ``zone`` at the instant ``at``.

    In order: the hourly factor of the zone whose period contains ``at``; else the zone's annual factor for
    the UTC year of ``at``; else the zone's annual factor of the nearest year (the earlier one on a tie), with
    ``mismatch=True`` and a note naming both years. Factors of other zones are never used.

    Raises :class:`NoFactor` when the zone has no usable factor and :class:`AmbiguousFactor` when two factors
    of the chosen granularity cover the same hour/year (filter versions and basis beforehand).
    """
    return _FactorIndex(factors).choose(zone, _utc(at, "at"))


# --------------------------------------------------------------------------------------------------------------
# Location-based method
# --------------------------------------------------------------------------------------------------------------


def location_based(consumptions: Iterable[Consumption], factors: Iterable[Factor]) -> LocationResult:
    """GHG Protocol Scope 2 location-based CO2e: each hour slice at the grid-average factor of its zone.

    Each consumption is split on UTC hour boundaries (:func:`split_by_hour`); each slice gets the factor
    chosen by :func:`select_factor` at its start, ``energy_kwh = energy_j / 3.6e6 x pue`` and
    ``co2e_g = energy_kwh x intensity_g_per_kwh``. Totals are exact sums divided once (see the module
    docstring); uncertainties follow IPCC Approach 1 (see :func:`relative_uncertainty_of_product` and the
    correlation model of the accumulator: slices of one site, zone and category are fully correlated).
    """
    index = _FactorIndex(factors)
    accumulator = _Accumulator()
    lines: list[LocationLine] = []
    uses: dict[str, tuple[Factor, list[str], list[Decimal], list[Decimal]]] = {}
    for piece in _chronological_slices(consumptions):
        choice = index.choose(piece.zone, piece.start)
        factor = choice.factor
        facility_j = piece.facility_energy_j
        numerator = _mul(facility_j, factor.intensity_g_per_kwh)
        relative = relative_uncertainty_of_product(
            piece.meter_relative_uncertainty, piece.pue_relative_uncertainty, factor.relative_uncertainty
        )
        accumulator.add(piece, facility_j, numerator, relative)
        lines.append(
            LocationLine(
                consumption=piece,
                choice=choice,
                energy_kwh=_div(facility_j, J_PER_KWH),
                co2e_g=_div(numerator, J_PER_KWH),
                relative_uncertainty=relative,
            )
        )
        use = uses.setdefault(factor.factor_id, (factor, [], [], []))
        use[1].extend(note for note in choice.notes if note not in use[1])
        use[2].append(facility_j)
        use[3].append(numerator)
    by_category, total = accumulator.totals()
    factors_used = tuple(
        FactorUse(
            factor=factor,
            notes=tuple(notes),
            energy_kwh=_div(_sum(energies), J_PER_KWH),
            co2e_g=_div(_sum(numerators), J_PER_KWH),
        )
        for factor, notes, energies, numerators in uses.values()
    )
    return LocationResult(lines=tuple(lines), by_category=by_category, total=total, factors_used=factors_used)


# --------------------------------------------------------------------------------------------------------------
# Market-based method
# --------------------------------------------------------------------------------------------------------------


def instrument_problems(instrument: Instrument) -> tuple[str, ...]:
    """Why an instrument cannot be used under the GHG Protocol Scope 2 Quality Criteria; empty if it can.

    First its vintage (:func:`vintage_problems`): one outside the years or longer than MAX_VINTAGE is not
    used, so that an instrument covers only the period it holds (its MWh bound the energy). Then every
    criterion in :data:`RELEVANT_CRITERIA` for the instrument's kind must be present and ``True``
    (absent = not attested = not used). A criterion key this module does not know is the caller's own,
    stricter rule: it fails the instrument when ``False``. A known key that does not apply to the kind
    (``supplier_rate_disclosed`` on a certificate, ``retired_for_reporter`` on a supplier rate) is ignored.
    """
    criteria = instrument.quality_criteria
    reasons = list(vintage_problems(instrument.vintage_start, instrument.vintage_end))
    for key in RELEVANT_CRITERIA[instrument.kind]:
        if key not in criteria:
            reasons.append(f"quality criterion {key!r} not attested ({_CRITERION_TEXT[key]})")
        elif not criteria[key]:
            reasons.append(f"quality criterion {key!r} not met ({_CRITERION_TEXT[key]})")
    for key, met in criteria.items():
        if key not in _CRITERION_TEXT and not met:
            reasons.append(f"quality criterion {key!r} not met")
    return tuple(reasons)


def _application_order(instrument: Instrument) -> tuple[int, str]:
    # Hourly volumes first (carbon-free ones before the others), since what an hour does not use expires;
    # then PPAs, supplier rates with a quantity, certificates, each by id; unlimited supplier rates last, as
    # the default for whatever the quantity-limited instruments leave (else they would leave nothing).
    if instrument.hourly_mwh is not None:
        rank = -2 if instrument.intensity_g_per_kwh == 0 else -1
    elif instrument.kind == "PPA":
        rank = 0
    elif instrument.kind == "supplier_rate":
        rank = 1 if instrument.mwh is not None else 3
    else:
        rank = 2
    return rank, instrument.instrument_id


def _instrument_categories(categories: Iterable[ScopeCategory]) -> frozenset[ScopeCategory]:
    """The scope categories whose slices may receive instruments, checked."""
    chosen = frozenset(categories)
    for category in chosen:
        _one_of(category, SCOPE_CATEGORIES, "instrument_categories")
    return chosen


def _eligible_instruments(
    instruments: Iterable[Instrument],
) -> tuple[list[Instrument], list[ExcludedInstrument]]:
    """Step 1: the instruments meeting the quality criteria, in application order, and the others (by id)
    with their reasons. Two instruments with one id are refused: one of them would be claimed twice."""
    valid: list[Instrument] = []
    excluded: list[ExcludedInstrument] = []
    seen_ids: set[str] = set()
    for instrument in instruments:
        if not isinstance(instrument, Instrument):
            raise TypeError(f"expected Instrument, got {type(instrument).__name__}")
        if instrument.instrument_id in seen_ids:
            raise ValueError(f"duplicate instrument_id {instrument.instrument_id!r}")
        seen_ids.add(instrument.instrument_id)
        reasons = instrument_problems(instrument)
        if reasons:
            excluded.append(ExcludedInstrument(instrument=instrument, reasons=reasons))
        else:
            valid.append(instrument)
    valid.sort(key=_application_order)
    excluded.sort(key=lambda e: e.instrument.instrument_id)
    return valid, excluded


def _residual_mix_index(residual_mixes: Iterable[ResidualMix]) -> dict[tuple[str, int], ResidualMix]:
    """The residual mixes by (zone, year); two for the same market and year leave the choice open: refused."""
    mixes: dict[tuple[str, int], ResidualMix] = {}
    for mix in residual_mixes:
        if (mix.zone, mix.year) in mixes:
            raise ValueError(f"two residual mixes for zone {mix.zone!r} in {mix.year}")
        mixes[(mix.zone, mix.year)] = mix
    return mixes


class _Allocation:
    """Step 2: what is left of each valid instrument, applied slice by slice in chronological order, and what
    each has covered within the counted period. Energies in facility joules, exact."""

    def __init__(self, valid: list[Instrument]) -> None:
        self._order = valid
        self._remaining_j: dict[str, Decimal | None] = {
            i.instrument_id: None if i.mwh is None else _mul(i.mwh, J_PER_MWH) for i in valid
        }
        self._covered_j: dict[str, Decimal] = {i.instrument_id: _ZERO for i in valid}
        # What is left of each hour's volume, for the instruments that carry hourly volumes.
        self._hour_left_j: dict[str, dict[datetime, Decimal]] = {
            i.instrument_id: {hour: _mul(mwh, J_PER_MWH) for hour, mwh in i.hourly_mwh.items()}
            for i in valid
            if i.hourly_mwh is not None
        }

    def allocate(
        self, piece: Consumption, energy_j: Decimal, *, counted: bool
    ) -> tuple[list[tuple[Instrument, Decimal]], Decimal]:
        """Apply the instruments to ``energy_j`` of the slice, in application order: the counted takes (each
        instrument and the joules it covers) and the joules left. A slice before the counted period uses the
        instruments up all the same, but its takes are neither returned nor counted as covered."""
        takes: list[tuple[Instrument, Decimal]] = []
        left_j = energy_j
        for instrument in self._order:
            if left_j == 0:
                break
            if instrument.zone != piece.zone or not (
                instrument.vintage_start <= piece.start < instrument.vintage_end
            ):
                continue
            remaining = self._remaining_j[instrument.instrument_id]
            hours = self._hour_left_j.get(instrument.instrument_id)
            # Slices never cross an hour (split_by_hour): the hour of the start is the slice's hour.
            hour = _floor_hour(piece.start)
            capacity = remaining if hours is None else hours.get(hour, _ZERO)
            take = left_j if capacity is None else min(left_j, capacity)
            if take == 0:
                continue
            if remaining is not None:
                self._remaining_j[instrument.instrument_id] = _sub(remaining, take)
            if hours is not None:
                hours[hour] = _sub(hours[hour], take)
            left_j = _sub(left_j, take)
            if counted:
                self._covered_j[instrument.instrument_id] = _EXACT.add(
                    self._covered_j[instrument.instrument_id], take
                )
                takes.append((instrument, take))
        return takes, left_j

    def uses(self) -> tuple[InstrumentUse, ...]:
        """Covered and unused MWh of each valid instrument, in application order."""
        uses: list[InstrumentUse] = []
        for instrument in self._order:
            unused_j = self._remaining_j[instrument.instrument_id]
            uses.append(
                InstrumentUse(
                    instrument=instrument,
                    covered_mwh=_div(self._covered_j[instrument.instrument_id], J_PER_MWH),
                    unused_mwh=None if unused_j is None else _div(unused_j, J_PER_MWH),
                )
            )
        return tuple(uses)


class _MarketBook:
    """The lines of the counted slices, their totals, and what the disclosures must report: the grid
    averages used for want of a residual mix, the residual mixes used, and the categories left without
    instruments."""

    def __init__(self) -> None:
        self.accumulator = _Accumulator()
        self.lines: list[MarketLine] = []
        self.uncovered_categories: set[ScopeCategory] = set()
        self.grid_average_j: dict[tuple[str, int], tuple[FactorChoice, Decimal]] = {}
        self.residual_used: dict[tuple[str, int], ResidualMix] = {}

    def instrument(self, piece: Consumption, instrument: Instrument, energy_j: Decimal) -> None:
        # A contractual factor carries no uncertainty of its own: the line's is metering and PUE only.
        self._line(
            piece, "instrument", instrument.instrument_id, energy_j, instrument.intensity_g_per_kwh, _ZERO
        )

    def remainder(
        self,
        piece: Consumption,
        energy_j: Decimal,
        mixes: Mapping[tuple[str, int], ResidualMix],
        factor_index: _FactorIndex,
    ) -> None:
        """Step 3: value what the instruments left of a slice at the residual mix of its zone and UTC year,
        else at the location-based grid average (remembered, to be disclosed)."""
        year = piece.start.year
        residual = mixes.get((piece.zone, year))
        if residual is not None:
            self.residual_used[(piece.zone, year)] = residual
            self._line(
                piece,
                "residual_mix",
                residual.source,
                energy_j,
                residual.intensity_g_per_kwh,
                residual.relative_uncertainty,
            )
            return
        choice = factor_index.choose(piece.zone, piece.start)
        # The disclosure names the zone and year's latest choice, with the energy of all its slices.
        previous = self.grid_average_j.get((piece.zone, year))
        self.grid_average_j[(piece.zone, year)] = (
            choice,
            energy_j if previous is None else _EXACT.add(previous[1], energy_j),
        )
        self._line(
            piece,
            "grid_average",
            choice.factor.factor_id,
            energy_j,
            choice.factor.intensity_g_per_kwh,
            choice.factor.relative_uncertainty,
        )

    def _line(
        self,
        piece: Consumption,
        source: MarketSource,
        source_id: str,
        facility_j: Decimal,
        intensity: Decimal,
        factor_relative: Decimal,
    ) -> None:
        numerator = _mul(facility_j, intensity)
        relative = relative_uncertainty_of_product(
            piece.meter_relative_uncertainty, piece.pue_relative_uncertainty, factor_relative
        )
        self.accumulator.add(piece, facility_j, numerator, relative)
        self.lines.append(
            MarketLine(
                consumption=piece,
                source=source,
                source_id=source_id,
                energy_kwh=_div(facility_j, J_PER_KWH),
                intensity_g_per_kwh=intensity,
                co2e_g=_div(numerator, J_PER_KWH),
                relative_uncertainty=relative,
            )
        )

    def disclosures(self) -> tuple[Disclosure, ...]:
        """What a report must print alongside the result, in a fixed order: grid averages used (by zone and
        year), residual mixes stating no uncertainty, categories that received no instrument."""
        disclosures = [
            _grid_average_disclosure(zone, year, choice, energy_j)
            for (zone, year), (choice, energy_j) in sorted(self.grid_average_j.items())
        ]
        for (zone, year), mix in sorted(self.residual_used.items()):
            if mix.relative_uncertainty == 0:
                disclosures.append(
                    Disclosure(
                        "The residual mix for zone {zone} in {year} ({source}) states no uncertainty; the "
                        "uncertainty of that share covers metering and PUE only.",
                        {"zone": zone, "year": str(year), "source": mix.source},
                    )
                )
        for category in SCOPE_CATEGORIES:
            if category in self.uncovered_categories:
                disclosures.append(
                    Disclosure(
                        "Contractual instruments were not applied to {category} consumption "
                        "({iso_category}); it is valued at the residual mix or grid average.",
                        {"category": category, "iso_category": ISO_14064_CATEGORY[category]},
                    )
                )
        return tuple(disclosures)


def _grid_average_disclosure(zone: str, year: int, choice: FactorChoice, energy_j: Decimal) -> Disclosure:
    factor = choice.factor
    template = (
        "No residual mix for zone {zone} in {year}: {energy} valued at the location-based grid average "
        "({factor_id}, {intensity}, {source}) instead. A grid average still contains attributes claimed by "
        "others, so this market-based figure double counts them (GHG Protocol Scope 2 Guidance, Quality "
        "Criterion 8)."
    )
    words = {"zone": zone, "year": str(year), "factor_id": factor.factor_id, "source": factor.source}
    if choice.notes:
        template += " Factor notes: {notes}."
        words["notes"] = "; ".join(choice.notes)
    return Disclosure(
        template,
        words,
        {
            "energy": ("energy_kwh", _div(energy_j, J_PER_KWH)),
            "intensity": ("intensity_g_per_kwh", factor.intensity_g_per_kwh),
        },
    )


def market_based(
    consumptions: Iterable[Consumption],
    instruments: Iterable[Instrument],
    residual_mixes: Iterable[ResidualMix],
    location_factors: Iterable[Factor],
    *,
    instrument_categories: Iterable[ScopeCategory] = ("scope2",),
    count_from: datetime | None = None,
) -> MarketResult:
    """GHG Protocol Scope 2 market-based CO2e.

    1. Instruments failing a relevant quality criterion (:func:`instrument_problems`) are excluded and
       returned with their reasons.
    2. Valid instruments are applied, in facility MWh (energy x PUE), to hour slices in chronological order;
       for each slice they are tried in a fixed order: instruments with hourly volumes (carbon-free ones
       first), PPAs, supplier rates with a quantity, certificates (REC, GO, I-REC), each group by
       ``instrument_id``, and finally supplier rates with ``mwh=None``. An instrument applies to a slice of
       its own zone whose start lies in its vintage (at most MAX_VINTAGE long, else it is excluded in step
       1), until its MWh run out; one with hourly volumes covers at most the slice's hour's volume, so it is
       matched hour by hour (what an hour leaves expires) while the others are matched over their vintage.
       Only slices whose category is in ``instrument_categories`` (default: ``scope2`` only; the reporter's
       own instruments do not cover a cloud provider's electricity) receive instruments.
    3. What is left is valued at the residual mix of the slice's zone and UTC year. Where the zone has no
       residual mix for that year, the location-based grid average is used (:func:`select_factor` over
       ``location_factors``) and a disclosure says so, since grid averages double count claimed attributes.

    Contractual factors (instruments) carry no factor uncertainty of their own; the line's uncertainty is then
    that of metering and PUE. Totals and uncertainties are aggregated as in :func:`location_based`.

    ``count_from``: slices that start earlier use up instruments (in the same order) but are neither
    booked nor counted, so a period's result is what it is within the whole history of its instruments.
    """
    counted_from = None if count_from is None else _utc(count_from, "count_from")
    categories = _instrument_categories(instrument_categories)
    valid, excluded = _eligible_instruments(instruments)
    mixes = _residual_mix_index(residual_mixes)
    factor_index = _FactorIndex(location_factors)
    allocation = _Allocation(valid)
    book = _MarketBook()
    for piece in _chronological_slices(consumptions):
        counted = counted_from is None or piece.start >= counted_from
        left_j = piece.facility_energy_j
        if piece.scope_category in categories:
            takes, left_j = allocation.allocate(piece, left_j, counted=counted)
            for instrument, take_j in takes:
                book.instrument(piece, instrument, take_j)
        elif valid and counted:
            book.uncovered_categories.add(piece.scope_category)
        # Nothing left to value: fully covered, a zero-energy slice, or a slice before the counted period.
        if counted and left_j != 0:
            book.remainder(piece, left_j, mixes, factor_index)
    by_category, total = book.accumulator.totals()
    return MarketResult(
        lines=tuple(book.lines),
        by_category=by_category,
        total=total,
        instruments_used=allocation.uses(),
        excluded=tuple(excluded),
        disclosures=book.disclosures(),
    )


# --------------------------------------------------------------------------------------------------------------
# Software Carbon Intensity (ISO/IEC 21031:2024)
# --------------------------------------------------------------------------------------------------------------


def sci_per_request(
    energy_j: Decimal, intensity_g_per_kwh: Decimal, embodied_g: Decimal, requests: Decimal | int
) -> Decimal:
    """Software Carbon Intensity per request, ISO/IEC 21031:2024: SCI = (E x I + M) / R.

    E is ``energy_j`` in kWh (/3.6e6; include PUE in ``energy_j`` if the boundary includes the facility),
    I the grid intensity in g/kWh, M the embodied emissions in g (see :func:`embodied_share_g`), R the number
    of requests (the functional unit). The result is g CO2e per request at DIVISION_PRECISION digits.

    SCI is a location-based rate by design: market-based instruments (certificates, PPAs, offsets) must not
    be used to lower it, so pass a location-based (ideally marginal or hourly) intensity here, never a
    market-based one.
    """
    e_j = _non_negative(energy_j, "energy_j")
    intensity = _non_negative(intensity_g_per_kwh, "intensity_g_per_kwh")
    embodied = _non_negative(embodied_g, "embodied_g")
    r = _positive(requests, "requests")
    # (E_j/3.6e6 x I + M) / R == (E_j x I + M x 3.6e6) / (3.6e6 x R): one division.
    numerator = _EXACT.add(_mul(e_j, intensity), _mul(embodied, J_PER_KWH))
    return _div(numerator, _mul(J_PER_KWH, r))


def embodied_share_g(
    device_embodied_kg: Decimal,
    lifetime_s: Decimal | int,
    reserved_s: Decimal | int,
    *,
    resource_share: Decimal | int = 1,
) -> Decimal:
    """Embodied emissions (g) attributable to a time reservation, SCI's M = TE x (TiR / EL) x RS.

    TE is ``device_embodied_kg`` (kg CO2e, converted to g), TiR ``reserved_s``, EL the expected lifetime
    ``lifetime_s``; RS (``resource_share``, default 1) is the share of the device reserved, e.g. 1/7 for one
    MIG slice of seven. Linear in time: a reservation longer than the lifetime gets more than TE.
    """
    te_g = _mul(_non_negative(device_embodied_kg, "device_embodied_kg"), Decimal(1000))
    lifetime = _positive(lifetime_s, "lifetime_s")
    reserved = _non_negative(reserved_s, "reserved_s")
    share = _non_negative(resource_share, "resource_share")
    if share > 1:
        raise ValueError(f"resource_share must be <= 1, got {share}")
    return _div(_mul(te_g, reserved, share), lifetime)
