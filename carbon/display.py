"""The one formatter for numbers shown to people: reports (PDF) and dashboard alike. Framework-free.

Rules, so that a figure reads the same everywhere:

- a unit chosen by magnitude: g, kg, t (CO2e); Wh, kWh, MWh; J as it is. The unit is the largest whose value
  is at least 1 (after rounding), so it never gets smaller as the magnitude grows;
- 4 significant figures, trailing zeros dropped ("1.2 kWh", "361.5 g"); a whole part longer than that is never
  rounded away ("12,346 t");
- thousands separators (","), a point for decimals, never E-notation;
- a value with its uncertainty in one unit, the uncertainty rounded up to two significant figures and the value
  to the same decimal place, keeping 3 to 4 significant figures ("3.04 kg ± 0.64 kg");
- percentages to 3 significant figures without trailing zeros ("5 %", "73.1 %");
- periods with both days included ("1-30 November 2026", with an en dash).

Only what people read goes through here: the CSV and JSON files keep the full precision of the snapshot.
Inputs are Decimals, ints, floats (read by their shortest repr) or decimal strings.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, timedelta
from decimal import ROUND_CEILING, ROUND_HALF_EVEN, Context, Decimal, localcontext

SIGNIFICANT = 4
PERCENT_SIGNIFICANT = 3
DASH = "\N{EN DASH}"
PLUS_MINUS = "\N{PLUS-MINUS SIGN}"

Number = Decimal | int | float | str

MASS_UNITS_G: tuple[tuple[str, Decimal], ...] = (
    ("g", Decimal(1)),
    ("kg", Decimal(10**3)),
    ("t", Decimal(10**6)),
)
ENERGY_UNITS_KWH: tuple[tuple[str, Decimal], ...] = (
    ("Wh", Decimal("0.001")),
    ("kWh", Decimal(1)),
    ("MWh", Decimal(1000)),
)
_ONE_UNIT_J: tuple[tuple[str, Decimal], ...] = (("J", Decimal(1)),)
# Wide enough for any figure a report holds (and a float's full range), so that no step rounds by accident.
_CONTEXT = Context(prec=400, Emax=10**6, Emin=-(10**6))


def to_decimal(value: Number) -> Decimal:
    """``value`` as an exact Decimal; a float by its shortest repr (0.1 is 0.1). Refuses NaN and infinities."""
    if isinstance(value, bool):
        raise TypeError("a boolean is not a number to display")
    if isinstance(value, float):
        value = repr(value)
    number = value if isinstance(value, Decimal) else Decimal(value)
    if not number.is_finite():
        raise ValueError(f"{value!r} is not a finite number")
    return number


def _decimals_for(value: Decimal, digits: int) -> int:
    """Decimal places that leave ``digits`` significant figures of ``value`` (never negative: the whole part
    stays whole)."""
    if value == 0:
        return 0
    return max(0, digits - 1 - value.adjusted())


def _quantize(value: Decimal, decimals: int, rounding: str = ROUND_HALF_EVEN) -> Decimal:
    with localcontext(_CONTEXT):
        return value.quantize(Decimal(1).scaleb(-decimals), rounding=rounding)


def _round_significant(value: Decimal, digits: int) -> Decimal:
    rounded = _quantize(value, _decimals_for(value, digits))
    if rounded != 0 and rounded.adjusted() > value.adjusted():  # 9.9996 -> 10.000: one figure too many
        rounded = _quantize(rounded, _decimals_for(rounded, digits))
    return rounded


def _text(value: Decimal, *, strip: bool) -> str:
    """``value`` with separators, in fixed notation; trailing fractional zeros dropped when ``strip``."""
    if value == 0:
        value = abs(value)  # no "-0"
    with localcontext(_CONTEXT):
        text = format(value, ",f")
    if strip and "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _pick_unit(value: Decimal, units: tuple[tuple[str, Decimal], ...], digits: int) -> tuple[str, Decimal]:
    """The largest unit in which the rounded magnitude is at least 1, with the value rounded in it."""
    magnitude = abs(value)
    chosen = 0
    for i, (_, scale) in enumerate(units):
        if magnitude >= scale:
            chosen = i
    while True:
        name, scale = units[chosen]
        with localcontext(_CONTEXT):
            scaled = value / scale
        rounded = _round_significant(scaled, digits)
        # 999.97 g rounds to 1000 g: that is 1 kg.
        if chosen + 1 < len(units) and abs(rounded) * scale >= units[chosen + 1][1]:
            chosen += 1
            continue
        return name, rounded


def _quantity(value: Number, units: tuple[tuple[str, Decimal], ...], digits: int) -> str:
    unit, rounded = _pick_unit(to_decimal(value), units, digits)
    return f"{_text(rounded, strip=True)} {unit}"


def number(value: Number, digits: int = SIGNIFICANT) -> str:
    """A plain number: ``digits`` significant figures, separators, no unit ("244.8", "12,346")."""
    return _text(_round_significant(to_decimal(value), digits), strip=True)


def count(value: int) -> str:
    """A count, whole, with separators ("50,000")."""
    return f"{int(value):,}"


def mass_g(grams: Number, digits: int = SIGNIFICANT) -> str:
    """A mass given in grams, in g, kg or t ("361.5 g", "3.043 kg"); the reader's context says CO2e."""
    return _quantity(grams, MASS_UNITS_G, digits)


def mass_t(tonnes: Number, digits: int = SIGNIFICANT) -> str:
    """A mass given in tonnes, printed as :func:`mass_g` prints it ("184.3 g" for 0.0001843 t)."""
    with localcontext(_CONTEXT):
        return mass_g(to_decimal(tonnes) * 10**6, digits)


def energy_kwh(kwh: Number, digits: int = SIGNIFICANT) -> str:
    """An energy given in kWh, in Wh, kWh or MWh ("550 Wh", "1.5 kWh")."""
    return _quantity(kwh, ENERGY_UNITS_KWH, digits)


def energy_mwh(mwh: Number, digits: int = SIGNIFICANT) -> str:
    """An energy given in MWh (instruments, certificates), printed as :func:`energy_kwh` prints it."""
    with localcontext(_CONTEXT):
        return energy_kwh(to_decimal(mwh) * 1000, digits)


def intensity_g_per_kwh(grams_per_kwh: Number, digits: int = SIGNIFICANT) -> str:
    """A carbon intensity in g CO2e per kWh, always in that unit ("41.44 g/kWh", "244.8 g/kWh")."""
    return f"{number(grams_per_kwh, digits)} g/kWh"


def energy_j(joules: Number, digits: int = SIGNIFICANT) -> str:
    """An energy in joules, for per-inference figures ("0.01235 J")."""
    return _quantity(joules, _ONE_UNIT_J, digits)


def _with_uncertainty(value: Number, uncertainty: Number, units: tuple[tuple[str, Decimal], ...]) -> str:
    v, u = to_decimal(value), abs(to_decimal(uncertainty))
    unit, _ = _pick_unit(v if v != 0 else u, units, SIGNIFICANT)
    scale = dict(units)[unit]
    with localcontext(_CONTEXT):
        v_unit, u_unit = v / scale, u / scale
    low, high = _decimals_for(v_unit, 3), _decimals_for(v_unit, 4)
    if v_unit == 0:
        low = high = _decimals_for(u_unit, 2)
    # The uncertainty's second significant figure sets the place, within 3 to 4 figures of the value.
    by_uncertainty = (
        _decimals_for(_quantize(u_unit, _decimals_for(u_unit, 2), ROUND_CEILING), 2) if u else high
    )
    decimals = min(max(by_uncertainty, low), high)
    shown_v = _quantize(v_unit, decimals)
    if decimals and shown_v != 0 and shown_v.adjusted() > v_unit.adjusted():
        # Rounding carried into the next power of ten (0.0000099995 -> 0.000010000): one place fewer keeps the
        # figures within 3 to 4.
        decimals -= 1
        shown_v = _quantize(v_unit, decimals)
    shown_u = _quantize(u_unit, decimals, ROUND_CEILING)
    return f"{_text(shown_v, strip=False)} {unit} {PLUS_MINUS} {_text(shown_u, strip=False)} {unit}"


def mass_g_pm(grams: Number, uncertainty_g: Number) -> str:
    """A mass and its uncertainty, both in grams, printed in one unit ("3.04 kg ± 0.64 kg"); the uncertainty
    is rounded up, never shown narrower than computed."""
    return _with_uncertainty(grams, uncertainty_g, MASS_UNITS_G)


def energy_kwh_pm(kwh: Number, uncertainty_kwh: Number) -> str:
    """An energy and its uncertainty, both in kWh, printed in one unit."""
    return _with_uncertainty(kwh, uncertainty_kwh, ENERGY_UNITS_KWH)


def percent(fraction: Number, digits: int = PERCENT_SIGNIFICANT) -> str:
    """A fraction as a percentage: 3 significant figures, no trailing zeros ("5 %", "73.1 %")."""
    with localcontext(_CONTEXT):
        hundredths = to_decimal(fraction) * 100
    return f"{_text(_round_significant(hundredths, digits), strip=True)} %"


def percent_points(value: Number, digits: int = PERCENT_SIGNIFICANT) -> str:
    """A figure already in percent (a setting such as a significance threshold of 5.00) as "5 %"."""
    with localcontext(_CONTEXT):
        return percent(to_decimal(value) / 100, digits)


def period(start: date, end_exclusive: date) -> str:
    """A period given by its first day and the day after its last, printed with both days included:
    "1-30 November 2026", "15 November - 15 December 2026", "1 December 2025 - 31 January 2026" (each dash
    an en dash)."""
    last = end_exclusive - timedelta(days=1)
    if last < start:
        raise ValueError(f"the period {start}..{end_exclusive} holds no day")
    if last == start:
        return f"{start.day} {start:%B} {start.year}"
    if (start.year, start.month) == (last.year, last.month):
        return f"{start.day}{DASH}{last.day} {last:%B} {last.year}"
    if start.year == last.year:
        return f"{start.day} {start:%B} {DASH} {last.day} {last:%B} {last.year}"
    return f"{start.day} {start:%B} {start.year} {DASH} {last.day} {last:%B} {last.year}"


def day(value: date) -> str:
    """One day, as in periods ("30 November 2026")."""
    return f"{value.day} {value:%B} {value.year}"


SERIES_UNITS: dict[str, tuple[tuple[str, Decimal], ...]] = {
    "mass_g": MASS_UNITS_G,
    "energy_kwh": ENERGY_UNITS_KWH,
}


def series_unit(values: Iterable[Number], quantity: str) -> tuple[str, Decimal]:
    """The one unit a chart draws all of ``values`` in (given in grams for ``mass_g``, in kWh for
    ``energy_kwh``): the unit :func:`mass_g` or :func:`energy_kwh` prints the largest magnitude in, with its
    scale (how many base units one of it holds). Divide by the scale to get the numbers the chart draws."""
    units = SERIES_UNITS[quantity]
    largest = max((abs(to_decimal(v)) for v in values), default=Decimal(0))
    unit, _ = _pick_unit(largest, units, SIGNIFICANT)
    return unit, dict(units)[unit]


def in_unit(value: Number, scale: Decimal, unit: str, digits: int = SIGNIFICANT) -> str:
    """``value`` (in base units) printed in the given unit of a series ("0.5 kWh" beside "12 kWh")."""
    with localcontext(_CONTEXT):
        return f"{number(to_decimal(value) / scale, digits)} {unit}"
