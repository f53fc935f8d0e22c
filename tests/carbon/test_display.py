"""The one number formatter for reports and dashboard (carbon/display.py): a unit chosen by magnitude, 3-4
significant figures, thousands separators, uncertainties in the value's unit, percentages without trailing
zeros, never E-notation (issue 25)."""

from __future__ import annotations

import ast
import re
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from carbon import display

MASS_UNITS = {"g": Decimal(1), "kg": Decimal(10**3), "t": Decimal(10**6)}
ENERGY_UNITS = {"Wh": Decimal("0.001"), "kWh": Decimal(1), "MWh": Decimal(1000)}
NUMBER = r"-?\d{1,3}(?:,\d{3})*(?:\.\d+)?"
# Half a unit of the fourth significant figure, relative to the value: the most 4 significant figures lose.
HALF_ULP = Decimal("0.0005")
DASH = "\N{EN DASH}"

magnitudes = st.decimals(
    min_value=Decimal("1e-9"), max_value=Decimal("1e15"), allow_nan=False, allow_infinity=False, places=12
).filter(lambda d: d > 0)
signed = st.one_of(magnitudes, magnitudes.map(lambda d: -d), st.just(Decimal(0)))


def parse(text: str, units: dict[str, Decimal]) -> tuple[Decimal, str]:
    """A printed quantity back to a number in the base unit, and the unit it was printed in."""
    match = re.fullmatch(rf"({NUMBER}) (\S+)", text)
    assert match, f"not a plain quantity: {text!r}"
    number, unit = match.groups()
    assert unit in units, text
    return Decimal(number.replace(",", "")) * units[unit], unit


def significant_digits(text: str) -> int:
    digits = re.sub(r"\D", "", text.split(" ")[0]).lstrip("0")
    return len(digits)


@given(signed)
def test_a_mass_reads_back_within_four_significant_figures(grams: Decimal) -> None:
    shown = display.mass_g(grams)
    value, _ = parse(shown, MASS_UNITS)
    assert abs(value - grams) <= HALF_ULP * abs(grams), shown


@given(signed)
def test_an_energy_reads_back_within_four_significant_figures(kwh: Decimal) -> None:
    shown = display.energy_kwh(kwh)
    value, _ = parse(shown, ENERGY_UNITS)
    assert abs(value - kwh) <= HALF_ULP * abs(kwh), shown


@given(signed)
def test_joules_and_plain_numbers_read_back_within_four_significant_figures(value: Decimal) -> None:
    joules = parse(display.energy_j(value), {"J": Decimal(1)})[0]
    assert abs(joules - value) <= HALF_ULP * abs(value)
    plain = display.number(value)
    assert re.fullmatch(NUMBER, plain), plain
    assert abs(Decimal(plain.replace(",", "")) - value) <= HALF_ULP * abs(value)


@given(magnitudes, magnitudes)
def test_the_unit_never_gets_smaller_as_the_magnitude_grows(a: Decimal, b: Decimal) -> None:
    low, high = sorted((a, b))
    for fmt, units in ((display.mass_g, MASS_UNITS), (display.energy_kwh, ENERGY_UNITS)):
        order = list(units)
        assert order.index(parse(fmt(low), units)[1]) <= order.index(parse(fmt(high), units)[1])
        assert order.index(parse(fmt(-high), units)[1]) == order.index(parse(fmt(high), units)[1])


@given(signed, st.floats(min_value=-1e15, max_value=1e15, allow_nan=False))
def test_never_e_notation_and_at_most_four_significant_figures_below_ten_thousand(
    value: Decimal, as_float: float
) -> None:
    for shown in (
        display.mass_g(value),
        display.energy_kwh(value),
        display.energy_j(value),
        display.number(value),
        display.mass_g(as_float),
        display.energy_kwh(as_float),
        display.number(as_float),
    ):
        assert "e" not in shown.lower().replace("wh", "") and "E" not in shown, shown
        assert re.fullmatch(rf"{NUMBER}( \S+)?", shown), shown
        whole = shown.split(" ")[0].replace(",", "").lstrip("-").split(".")[0]
        # The whole part is never rounded away (12,345 t stays 12,345 t); below that, 4 figures at most.
        assert significant_digits(shown) <= max(4, len(whole.lstrip("0"))), shown


def test_units_are_chosen_by_magnitude_with_thousands_separators() -> None:
    assert display.mass_g(Decimal("361.518")) == "361.5 g"
    assert display.mass_g(Decimal("3042.755")) == "3.043 kg"
    assert display.mass_g(Decimal("999.97")) == "1 kg"
    assert display.mass_g(Decimal("12345678901")) == "12,346 t"
    assert display.mass_g(Decimal("0.000184")) == "0.000184 g"
    assert display.mass_g(Decimal(0)) == "0 g"
    assert display.energy_kwh(Decimal("0.55")) == "550 Wh"
    assert display.energy_kwh(Decimal("1.5")) == "1.5 kWh"
    assert display.energy_kwh(Decimal("123456.7")) == "123.5 MWh"
    assert display.energy_j(Decimal("0.0123456")) == "0.01235 J"
    assert display.number(Decimal("244.758")) == "244.8"
    assert display.count(50000) == "50,000"
    assert display.mass_g(0.1) == "0.1 g"  # floats are read by their shortest repr, not their binary value


def test_an_uncertainty_is_printed_in_the_values_unit_never_narrower() -> None:
    assert display.mass_g_pm(Decimal("3042.755"), Decimal("638.824")) == "3.04 kg ± 0.64 kg"
    assert display.mass_g_pm(Decimal("3042.755"), Decimal("30.4")) == "3.043 kg ± 0.031 kg"
    assert display.mass_g_pm(Decimal("49.728"), Decimal("0")) == "49.73 g ± 0.00 g"
    assert display.mass_g_pm(Decimal("1500000"), Decimal("999")) == "1.500 t ± 0.001 t"


@given(magnitudes, st.decimals(min_value=0, max_value=Decimal("0.9"), places=6))
@example(Decimal("0.000009999500"), Decimal("0"))  # rounding carried into the next power of ten (found by CI)
def test_a_value_with_its_uncertainty_shares_one_unit_and_keeps_the_interval(
    grams: Decimal, relative: Decimal
) -> None:
    uncertainty = grams * relative
    shown = display.mass_g_pm(grams, uncertainty)
    value_text, _, u_text = shown.partition(" ± ")
    value, unit = parse(value_text, MASS_UNITS)
    u, u_unit = parse(u_text, MASS_UNITS)
    assert unit == u_unit, shown
    assert u >= uncertainty, shown  # rounded up: never narrower than computed
    decimals = len(value_text.split(" ")[0].partition(".")[2])
    assert decimals == len(u_text.split(" ")[0].partition(".")[2]), shown
    assert abs(value - grams) <= Decimal(5).scaleb(-decimals - 1) * MASS_UNITS[unit], shown
    whole = value_text.split(" ")[0].replace(",", "").split(".")[0].lstrip("0")
    assert 3 <= significant_digits(value_text) <= max(4, len(whole)), shown


@given(st.decimals(min_value=0, max_value=10, places=8))
def test_percentages_have_no_trailing_zeros(fraction: Decimal) -> None:
    shown = display.percent(fraction)
    assert shown.endswith(" %")
    number = shown[:-2]
    assert re.fullmatch(NUMBER, number), shown
    assert not (("." in number and number.endswith("0")) or number.endswith(".")), shown
    # Three significant figures: within half a unit of the third, relative to the value.
    assert abs(Decimal(number.replace(",", "")) - fraction * 100) <= Decimal("0.005") * fraction * 100, shown


def test_percentages() -> None:
    assert display.percent(Decimal("0.05")) == "5 %"
    assert display.percent(Decimal("0.050000")) == "5 %"
    assert display.percent(Decimal("0.7312")) == "73.1 %"
    assert display.percent(Decimal(1)) == "100 %"
    assert display.percent(Decimal(0)) == "0 %"


def test_periods_are_printed_inclusive() -> None:
    assert display.period(date(2026, 11, 1), date(2026, 12, 1)) == f"1{DASH}30 November 2026"
    assert display.period(date(2026, 11, 30), date(2026, 12, 1)) == "30 November 2026"
    assert display.period(date(2026, 11, 15), date(2026, 12, 16)) == f"15 November {DASH} 15 December 2026"
    assert display.period(date(2025, 12, 1), date(2026, 2, 1)) == f"1 December 2025 {DASH} 31 January 2026"
    assert display.period(date(2025, 1, 1), date(2026, 1, 1)) == f"1 January {DASH} 31 December 2025"


@given(
    st.dates(min_value=date(1971, 1, 1), max_value=date(2099, 1, 1)), st.integers(min_value=1, max_value=800)
)
def test_a_period_names_its_first_and_last_day(start: date, days: int) -> None:
    shown = display.period(start, start + timedelta(days=days))
    last = start + timedelta(days=days - 1)
    assert str(last.day) in shown and last.strftime("%B") in shown and str(last.year) in shown
    assert shown.startswith(str(start.day))


def test_the_formatter_is_framework_free() -> None:
    source = Path(display.__file__).read_text()
    imported = {
        (node.module or "").split(".")[0] if isinstance(node, ast.ImportFrom) else alias.name.split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported <= {"__future__", "datetime", "decimal", "typing", "collections"}, imported
