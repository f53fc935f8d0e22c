"""The market-based method's disclosures print their numbers through the one formatter in the PDF ("550 Wh",
"244.8 g/kWh"), never as raw decimals ("0.550000 kWh"); the JSON keeps them at full precision."""

from __future__ import annotations

import re

import pytest

from carbon import display
from tests.reports.conftest import generate, pdf_text, section

pytestmark = pytest.mark.django_db

RAW_DECIMAL = re.compile(r"\d\.\d*0(?= ?(?:k?Wh|MWh|g/kWh))|\d\.\d{5,}")


def test_market_based_disclosures_print_formatted_numbers_in_the_pdf_and_exact_ones_in_the_json(
    two_sites,
) -> None:
    report = generate(two_sites)

    exact = report.snapshot["results"]["market_based"]["disclosures"]  # type: ignore[index]
    grid = [d for d in exact if d.startswith("No residual mix for zone US-VA")]
    assert grid and "0.550000 kWh" in grid[0] and "244.758" in grid[0]  # full precision in the JSON
    text = section(pdf_text(report), "6. Market-based method")
    assert "No residual mix for zone US-VA in 2025" in text
    assert f"{display.energy_kwh('0.55')} valued at" in text  # "550 Wh valued at"
    assert f"{display.number('244.758')} g/kWh" in text  # "244.8 g/kWh"
    assert "0.550000" not in text and "244.758000" not in text and "41.440000" not in text
    assert not RAW_DECIMAL.search(text), RAW_DECIMAL.search(text)
