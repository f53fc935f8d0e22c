"""A market-based disclosure is its exact text (what JSON keeps) and can be written again with other number
formats (what the PDF prints), the words around the numbers unchanged."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from carbon import co2e, display

amounts = st.decimals(min_value=0, max_value=10**9, places=9, allow_nan=False, allow_infinity=False)


@given(energy=amounts, intensity=amounts, source=st.text(max_size=40))
def test_a_disclosure_is_its_exact_text_and_rewrites_only_its_numbers(
    energy: Decimal, intensity: Decimal, source: str
) -> None:
    disclosure = co2e.Disclosure(
        "{energy} valued at {intensity} ({source})",
        {"source": source},
        {"energy": ("energy_kwh", energy), "intensity": ("intensity_g_per_kwh", intensity)},
    )

    assert disclosure == f"{co2e.report_kwh(energy)} kWh valued at {intensity} g/kWh ({source})"
    assert disclosure.text(co2e.EXACT_QUANTITY) == disclosure
    shown = disclosure.text(
        {"energy_kwh": display.energy_kwh, "intensity_g_per_kwh": display.intensity_g_per_kwh}
    )
    assert (
        shown == f"{display.energy_kwh(energy)} valued at {display.intensity_g_per_kwh(intensity)} ({source})"
    )
