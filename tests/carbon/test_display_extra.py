"""The one formatter's series helpers: a chart's unit is the one the formatter prints its largest value in."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from carbon import display

values = st.lists(
    st.decimals(min_value=0, max_value=Decimal("1e12"), allow_nan=False, allow_infinity=False, places=6),
    min_size=1,
    max_size=20,
)


@given(values, st.sampled_from(["mass_g", "energy_kwh"]))
def test_a_series_is_drawn_in_the_unit_its_largest_value_is_printed_in(
    series: list[Decimal], quantity: str
) -> None:
    unit, scale = display.series_unit(series, quantity)
    printed = display.mass_g(max(series)) if quantity == "mass_g" else display.energy_kwh(max(series))
    assert printed.endswith(" " + unit)
    assert display.in_unit(max(series), scale, unit) == printed


@given(values)
def test_every_value_of_a_series_prints_in_the_series_unit_without_e_notation(series: list[Decimal]) -> None:
    unit, scale = display.series_unit(series, "energy_kwh")
    for value in series:
        text = display.in_unit(value, scale, unit)
        assert text.endswith(" " + unit) and "E" not in text and "e" not in text.split()[0]


def test_an_empty_or_zero_series_is_in_the_smallest_unit() -> None:
    assert display.series_unit([], "mass_g") == ("g", Decimal(1))
    assert display.series_unit([0, 0.0], "energy_kwh") == ("Wh", Decimal("0.001"))
    assert display.in_unit(1500, Decimal(1000), "kg") == "1.5 kg"
